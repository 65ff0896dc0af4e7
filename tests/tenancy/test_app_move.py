"""Workspace, Membership and ApiToken moved from `runs` to the `tenancy` app without touching the
database: the tables, columns, constraints and every foreign key to a workspace are what they
were, and the four migrations of the move (tenancy.0001, agents.0002, notify.0002, runs.0017)
run no SQL either way."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.apps import apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from notify.models import Subscription
from oz0agents.models import Agent
from oz0site.config import migrating
from runs.models import Executor, IdempotencyKey, Run
from tenancy.models import ApiToken, Membership, Workspace

RUNS_BEFORE = ("runs", "0016_workspace_stored_input_bytes")
MAIN_LEAVES = [RUNS_BEFORE, ("agents", "0001_initial"), ("notify", "0001_initial"), ("tenancy", None)]
MOVE = [
    ("tenancy", "0001_initial"),
    ("agents", "0002_i28_tenancy_workspace"),
    ("notify", "0002_i28_tenancy_workspace"),
    ("runs", "0017_i28_tenancy_moves_to_the_tenancy_app"),
]
AFTER_MOVE = [MOVE[3], MOVE[1], MOVE[2], MOVE[0]]
MOVED_TABLES = ("runs_workspace", "runs_membership", "runs_apitoken")
# Every table with a foreign key to a workspace.
POINTING = ("runs_run", "runs_executor", "runs_idempotencykey", "runs_agent", "notify_subscription")

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _migrating() -> Iterator[None]:
    """These tests migrate by hand, as the migrate command does: without the idle bound."""
    with migrating(connection):
        yield


def _schema(tables: tuple[str, ...] = MOVED_TABLES + POINTING) -> dict[str, Any]:
    """Columns (name, type, nullability) and constraints (columns, kind, target) of the tables."""
    found: dict[str, Any] = {}
    with connection.cursor() as cursor:
        for table in tables:
            columns = {
                (column.name, column.type_code, column.null_ok)
                for column in connection.introspection.get_table_description(cursor, table)
            }
            constraints = {
                name: (tuple(c["columns"]), c["unique"], c["primary_key"], c["foreign_key"], c["index"])
                for name, c in connection.introspection.get_constraints(cursor, table).items()
            }
            found[table] = {"columns": columns, "constraints": constraints}
    return found


def test_it_resolves_the_models_in_the_tenancy_app_on_the_old_tables() -> None:
    for model in (Workspace, Membership, ApiToken):
        assert apps.get_model("tenancy", model.__name__) is model
        with pytest.raises(LookupError):
            apps.get_model("runs", model.__name__)
    assert (Workspace._meta.db_table, Membership._meta.db_table, ApiToken._meta.db_table) == MOVED_TABLES
    for model in (Run, Executor, IdempotencyKey, Agent, Subscription, Membership):
        assert model._meta.get_field("workspace").related_model is Workspace, model
    assert {c.name for c in Membership._meta.constraints} == {"membership_unique_user"}


def test_it_keeps_the_tables_columns_and_constraints() -> None:
    schema = _schema()
    assert {name for name, _, _ in schema["runs_workspace"]["columns"]} == {
        "id",
        "slug",
        "name",
        "created_at",
        "stored_input_bytes",
        "retention_days",  # added after the move (issue 32: each workspace's retention)
        # added after the move (issue 31 item 4: each workspace's wait deadlines)
        "reminder_seconds",
        "escalation_seconds",
        "escalate_to_id",
    }
    assert {name for name, _, _ in schema["runs_membership"]["columns"]} == {"id", "workspace_id", "user_id", "role"}
    assert {name for name, _, _ in schema["runs_apitoken"]["columns"]} == {
        "id",
        "user_id",
        "digest",
        "hint",
        "label",
        "created_at",
        "last_used_at",
        "expires_at",
        "revoked_at",
    }
    membership = schema["runs_membership"]["constraints"]
    assert membership["membership_unique_user"][:2] == (("workspace_id", "user_id"), True)
    for table in ("runs_membership", *POINTING):
        foreign_keys = {c[0]: c[3] for c in schema[table]["constraints"].values() if c[3]}
        assert foreign_keys[("workspace_id",)] == ("runs_workspace", "id"), table


def test_a_database_built_from_zero_moves_the_models_after_main_s_migrations() -> None:
    plan = MigrationExecutor(connection).loader.graph.forwards_plan(MOVE[3])
    assert plan.index(RUNS_BEFORE) < plan.index(MOVE[0]) < plan.index(MOVE[1]) < plan.index(MOVE[3])
    assert plan.index(MOVE[0]) < plan.index(MOVE[2]) < plan.index(MOVE[3])


def test_the_move_runs_no_sql_either_way() -> None:
    loader = MigrationExecutor(connection).loader
    for backwards in (False, True):
        statements: list[str] = []
        for key in reversed(MOVE) if backwards else MOVE:
            migration = loader.graph.nodes[key]
            # The state just before this migration (the move spans three apps' histories).
            state = loader.project_state(key, at_end=False)
            with connection.schema_editor(collect_sql=True, atomic=migration.atomic) as editor:
                (migration.unapply if backwards else migration.apply)(state, editor, collect_sql=True)
            statements.extend(line for line in editor.collected_sql if not line.strip().startswith("--"))
        assert statements == [], statements


@pytest.mark.thorough  # migrates the whole schema (from nothing, or back and forth)
def test_it_migrates_back_to_the_schema_before_the_move_and_forward_again() -> None:
    """From the schema main had (runs at 0016, no tenancy app) to now and back, the tables stay as
    they are and the state moves the models between the apps."""
    before = _schema()
    executor = MigrationExecutor(connection)
    leaves = executor.loader.graph.leaf_nodes()
    # Migrations after the move (none yet, a later one may build an index concurrently, which
    # cannot run inside the test's transaction) are stepped over as recorded.
    executor.migrate(AFTER_MOVE, fake=True)
    try:
        executor.loader.build_graph()
        executor.migrate(MAIN_LEAVES)
        executor.loader.build_graph()
        assert _schema() == before
        old = executor.loader.project_state([key for key in MAIN_LEAVES if key[1]]).apps
        assert old.get_model("runs", "Workspace")._meta.db_table == "runs_workspace"
        assert old.get_model("runs", "Run")._meta.get_field("workspace").related_model._meta.app_label == "runs"
        with pytest.raises(LookupError):
            old.get_app_config("tenancy").get_model("Workspace")
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(AFTER_MOVE)
        executor.loader.build_graph()
        executor.migrate(leaves, fake=True)
    assert _schema() == before
    new = MigrationExecutor(connection).loader.project_state(leaves).apps
    for label, model in (("runs", "Run"), ("runs", "Executor"), ("agents", "Agent"), ("notify", "Subscription")):
        assert new.get_model(label, model)._meta.get_field("workspace").related_model._meta.app_label == "tenancy"
    assert not MigrationExecutor(connection).migration_plan(leaves)
