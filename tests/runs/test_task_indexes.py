"""The task table's indexes: a status change writes a new entry into every index of the table
(status is in the partial indexes, so the update is never HOT), so the two columns almost every
task leaves NULL, the await token and the child run, are indexed only where set, and still serve
their lookups and keep their guarantees."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from runs.models import Run, Task
from tests.conftest import Team


def _index_definitions() -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'runs_task'")
        return dict(cursor.fetchall())


def _indexes_on(column: str) -> dict[str, str]:
    return {name: sql for name, sql in _index_definitions().items() if f"({column})" in sql}


def _plan(sql: str, params: list[Any]) -> str:
    with transaction.atomic(), connection.cursor() as cursor:
        # A test table is tiny: without this the planner rightly prefers a scan of the heap.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


def _await_run(team: Team) -> tuple[str, str]:
    status, created = team.api().post(
        f"/workspaces/{team.slug}/runs", {"tasks": [{"key": "q", "kind": "await", "question": "Ship it?"}]}
    )
    assert status == 201, created
    return created["run"]["id"], created["receipt"]["tokens"]["q"]


def test_the_token_and_the_child_are_each_indexed_once_and_only_where_set(db: Any) -> None:
    token_indexes = _indexes_on("resolution_token")
    assert list(token_indexes) == ["task_unique_resolution_token"], token_indexes
    assert "UNIQUE" in token_indexes["task_unique_resolution_token"]
    assert token_indexes["task_unique_resolution_token"].endswith("WHERE (resolution_token IS NOT NULL)")
    child_indexes = _indexes_on("child_id")
    assert list(child_indexes) == ["task_child"], child_indexes
    assert child_indexes["task_child"].endswith("WHERE (child_id IS NOT NULL)")


def test_a_token_is_still_unique_while_tasks_without_one_are_many(team: Team) -> None:
    run_id, _token = _await_run(team)
    stored = Task.objects.get(run_id=run_id, key="q").resolution_token
    assert stored
    second_id, _ = _await_run(team)
    for index in range(3):  # tokenless tasks: NULLs never collide
        status, body = team.api().post(
            f"/runs/{second_id}/append", {"tasks": [{"key": f"t{index}", "kind": "tool", "tool": "test.echo", "after": ["q"]}]}
        )
        assert status in (200, 201), body
    with pytest.raises(IntegrityError), transaction.atomic():
        Task.objects.filter(run_id=second_id, key="q").update(resolution_token=stored)
    assert Task.objects.filter(resolution_token=stored).count() == 1


def test_the_lookups_by_token_and_by_child_use_the_partial_indexes(team: Team) -> None:
    run_id, _token = _await_run(team)
    by_token = _plan("SELECT run_id FROM runs_task WHERE resolution_token = %s", ["f" * 64])
    assert re.search(r"(using|Index Scan on) task_unique_resolution_token\b", by_token), by_token
    by_child = _plan("SELECT id FROM runs_task WHERE child_id = %s", [run_id])
    assert re.search(r"(using|Index Scan on) task_child\b", by_child), by_child


def test_deleting_a_child_run_still_clears_its_delegate_tasks_link(team: Team) -> None:
    parent_id, _ = _await_run(team)
    child_id, _ = _await_run(team)
    Task.objects.filter(run_id=parent_id, key="q").update(child_id=child_id)
    Run.objects.filter(pk=child_id).delete()
    assert Task.objects.get(run_id=parent_id, key="q").child_id is None
