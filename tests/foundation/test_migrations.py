"""The data migrations of the security work, run on a database of their own from the schema before them."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from tests.foundation.helpers import clean_env, manage


def _admin_params() -> dict[str, Any]:
    params = dict(connection.get_connection_params())
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    params["dbname"] = "postgres"
    return params


@pytest.fixture
def scratch_database(django_db_blocker: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    name = f"{connection.settings_dict['NAME']}_migrations_{uuid.uuid4().hex[:6]}"
    with django_db_blocker.unblock():
        admin = _admin_params()
    with psycopg.connect(**admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    params = {**admin, "dbname": name}
    try:
        yield name, params
    finally:
        with psycopg.connect(**admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _database_url(name: str, params: dict[str, Any]) -> str:
    user = params.get("user") or "postgres"
    password = f":{params['password']}" if params.get("password") else ""
    return f"postgres://{user}{password}@{params.get('host') or '127.0.0.1'}:{params.get('port') or 5432}/{name}"


@pytest.mark.thorough  # migrates the whole schema (from nothing, or back and forth)
def test_it_moves_agents_into_the_workspaces_that_ran_them_and_hashes_await_tokens(
    scratch_database: tuple[str, dict[str, Any]],
) -> None:
    name, params = scratch_database
    env = clean_env(DATABASE_URL=_database_url(name, params), REDIS_URL=settings.REDIS_URL, DEBUG="1")
    before = manage("migrate", "runs", "0002_executors", env=env, timeout=180)
    assert before.returncode == 0, before.stdout + before.stderr

    with psycopg.connect(**params, autocommit=True) as conn:

        def one(sql: str, *args: Any) -> Any:
            row = conn.execute(sql, args).fetchone()
            assert row is not None
            return row[0]

        demo = one("INSERT INTO runs_workspace (slug, name, created_at) VALUES ('demo', '', now()) RETURNING id")
        other = one("INSERT INTO runs_workspace (slug, name, created_at) VALUES ('other', '', now()) RETURNING id")
        shared = one("INSERT INTO runs_agent (name, created_at) VALUES ('shared', now()) RETURNING id")
        unused = one("INSERT INTO runs_agent (name, created_at) VALUES ('unused', now()) RETURNING id")
        versions = {}
        for agent, version in ((shared, 1), (shared, 2), (unused, 1)):
            versions[(agent, version)] = one(
                "INSERT INTO runs_agentversion (agent_id, version, manifest_text, manifest, digest, created_at) "
                "VALUES (%s, %s, 'text', '{\"name\": \"x\"}', 'd', now()) RETURNING id",
                agent,
                version,
            )
        run_sql = (
            "INSERT INTO runs_run (id, workspace_id, agent_version_id, agent_name, private, status, deliverable, announcements, "
            "approval, retry_budget, last_seq, created_at, updated_at) VALUES (gen_random_uuid(), %s, %s, 'shared', false, "
            "'running', '', '{}', '{}', 0, 0, now(), now()) RETURNING id"
        )
        demo_run = one(run_sql, demo, versions[(shared, 1)])
        other_run = one(run_sql, other, versions[(shared, 2)])
        token = "plain-await-token"
        conn.execute(
            "INSERT INTO runs_task (run_id, key, kind, after, on_failure, spec, status, ready, attempt, lineage, composed, "
            "state, cancel_requested, resolution_token, created_at, position) VALUES (%s, 'q', 'await', '{}', 'propagate', "
            "'{}', 'dispatched', false, 0, 'q', false, '{}', false, %s, now(), 1)",
            (other_run, token),
        )

    after = manage("migrate", env=env, timeout=300)
    assert after.returncode == 0, after.stdout + after.stderr

    with psycopg.connect(**params, autocommit=True) as conn:
        agents = conn.execute(
            "SELECT a.name, w.slug, array_agg(v.version ORDER BY v.version) FROM runs_agent a "
            "JOIN runs_workspace w ON w.id = a.workspace_id JOIN runs_agentversion v ON v.agent_id = a.id "
            "GROUP BY a.id, a.name, w.slug ORDER BY a.name, w.slug"
        ).fetchall()
        assert agents == [("shared", "demo", [1, 2]), ("shared", "other", [1, 2]), ("unused", "demo", [1])]
        ran = dict(
            conn.execute(
                "SELECT r.id, w.slug || ':' || a.name || '@' || v.version FROM runs_run r "
                "JOIN runs_agentversion v ON v.id = r.agent_version_id JOIN runs_agent a ON a.id = v.agent_id "
                "JOIN runs_workspace w ON w.id = a.workspace_id"
            ).fetchall()
        )
        # Each run still ran the same version, now its own workspace's copy.
        assert ran == {demo_run: "demo:shared@1", other_run: "other:shared@2"}
        stored = conn.execute("SELECT resolution_token FROM runs_task WHERE run_id = %s", (other_run,)).fetchone()
        assert stored == (hashlib.sha256(token.encode()).hexdigest(),)
    assert os.environ.get("TEST_DATABASE_NAME", "") != name
