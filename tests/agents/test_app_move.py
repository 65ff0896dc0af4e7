"""Agent and AgentVersion moved from `runs` to the `agents` app without touching the database:
the tables, columns, constraints and the runs → versions foreign key are what they were, and
the two migrations of the move run no SQL either way."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.apps import apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from oz0agents.models import Agent, AgentVersion
from oz0site.config import migrating
from runs.models import Run
from tenancy.models import Workspace

MAIN_LEAVES = [("runs", "0006_effects_belong_to_a_workspace"), ("agents", None)]
MOVE = [("agents", "0001_initial"), ("runs", "0007_agents_move_to_the_agents_app")]
AFTER_MOVE = [("runs", "0007_agents_move_to_the_agents_app"), ("agents", "0001_initial")]

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _migrating() -> Iterator[None]:
    """These tests migrate by hand, as the migrate command does: without the idle bound."""
    with migrating(connection):
        yield


def _schema(tables: tuple[str, ...] = ("runs_agent", "runs_agentversion", "runs_run")) -> dict[str, Any]:
    """Columns (name, type, nullability) and constraints (columns, kind, target) of the tables."""
    found: dict[str, Any] = {}
    with connection.cursor() as cursor:
        for table in tables:
            columns = {
                (column.name, column.type_code, column.null_ok)
                for column in connection.introspection.get_table_description(cursor, table)
            }
            constraints = {
                name: (
                    tuple(c["columns"]),
                    c["unique"],
                    c["primary_key"],
                    c["foreign_key"],
                    c["index"],
                )
                for name, c in connection.introspection.get_constraints(cursor, table).items()
            }
            found[table] = {"columns": columns, "constraints": constraints}
    return found


def test_it_resolves_the_models_in_the_agents_app_on_the_old_tables() -> None:
    assert apps.get_model("agents", "Agent") is Agent
    assert apps.get_model("agents", "AgentVersion") is AgentVersion
    with pytest.raises(LookupError):
        apps.get_model("runs", "Agent")
    with pytest.raises(LookupError):
        apps.get_model("runs", "AgentVersion")
    assert Agent._meta.db_table == "runs_agent"
    assert AgentVersion._meta.db_table == "runs_agentversion"
    assert Run._meta.get_field("agent_version").related_model is AgentVersion
    assert AgentVersion._meta.get_field("agent").related_model is Agent
    assert Agent._meta.get_field("workspace").related_model is Workspace
    assert {c.name for c in Agent._meta.constraints} == {"agent_unique_name_per_workspace"}
    assert {c.name for c in AgentVersion._meta.constraints} == {"agent_version_unique"}


def test_it_keeps_the_tables_columns_and_constraints() -> None:
    schema = _schema()
    assert {name for name, _, _ in schema["runs_agent"]["columns"]} == {
        "id",
        "workspace_id",
        "name",
        "created_at",
        # added after the move (issue 33: canary rollouts)
        "stable_version_id",
        "canary_version_id",
        "canary_percent",
        "canary_since",
    }
    assert {name for name, _, _ in schema["runs_agentversion"]["columns"]} == {
        "id",
        "agent_id",
        "version",
        "manifest_text",
        "manifest",
        "digest",
        "created_at",
        "code_digest",  # added after the move (issue 29: the code a version runs)
    }
    agent = schema["runs_agent"]["constraints"]
    assert agent["agent_unique_name_per_workspace"][:2] == (("workspace_id", "name"), True)
    version = schema["runs_agentversion"]["constraints"]
    assert version["agent_version_unique"][:2] == (("agent_id", "version"), True)
    foreign_keys = {c[0]: c[3] for c in schema["runs_run"]["constraints"].values() if c[3]}
    assert foreign_keys[("agent_version_id",)] == ("runs_agentversion", "id")
    foreign_keys = {c[0]: c[3] for c in version.values() if c[3]}
    assert foreign_keys[("agent_id",)] == ("runs_agent", "id")


def test_a_database_built_from_zero_moves_the_models_after_main_s_migrations() -> None:
    plan = MigrationExecutor(connection).loader.graph.forwards_plan(MOVE[1])
    assert plan.index(MAIN_LEAVES[0]) < plan.index(MOVE[0]) < plan.index(MOVE[1])


def test_the_move_runs_no_sql_either_way() -> None:
    executor = MigrationExecutor(connection)
    nodes = executor.loader.graph.nodes
    forwards = [(nodes[key], False) for key in MOVE]
    backwards = [(nodes[key], True) for key in reversed(MOVE)]
    for plan in (forwards, backwards):
        statements = [line for line in executor.loader.collect_sql(plan) if not line.strip().startswith("--")]
        assert statements == [], statements


@pytest.mark.thorough  # migrates the whole schema (from nothing, or back and forth)
def test_it_migrates_back_to_the_schema_before_the_move_and_forward_again() -> None:
    """From the schema main had (runs at 0006, no agents app) to now and back, the tables stay
    as they are and the state moves the models between the apps."""
    before = _schema()
    executor = MigrationExecutor(connection)
    leaves = executor.loader.graph.leaf_nodes()
    # The runs migrations after the move (a trace index built concurrently, a task column) touch none
    # of these tables and cannot run inside the test's transaction: they are stepped over as recorded.
    executor.migrate(AFTER_MOVE, fake=True)
    try:
        executor.loader.build_graph()
        executor.migrate(MAIN_LEAVES)
        executor.loader.build_graph()
        assert _schema() == before
        old = executor.loader.project_state(MAIN_LEAVES[:1]).apps
        assert old.get_model("runs", "AgentVersion")._meta.db_table == "runs_agentversion"
        assert old.get_model("runs", "Run")._meta.get_field("agent_version").related_model._meta.app_label == "runs"
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate([*AFTER_MOVE, ("notify", "0001_initial")])
        executor.loader.build_graph()
        executor.migrate(leaves, fake=True)
    assert _schema() == before
    new = MigrationExecutor(connection).loader.project_state(leaves).apps
    assert new.get_model("runs", "Run")._meta.get_field("agent_version").related_model._meta.app_label == "agents"
    assert not MigrationExecutor(connection).migration_plan(leaves)
