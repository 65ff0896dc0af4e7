"""Property-based tests: random graphs with random outcomes and random repairs keep the kernel's invariants."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runs import kernel
from runs.kernel import graph
from runs.models import Run, Task
from runs.selectors import candidates
from tests.conftest import Team
from tests.runs.driver import drive, trace

POLICIES = ("propagate", "absorb", "halt")


@st.composite
def graphs(draw: Any) -> list[dict[str, Any]]:
    size = draw(st.integers(min_value=1, max_value=9))
    tasks: list[dict[str, Any]] = []
    for index in range(size):
        key = f"t{index}"
        earlier = [t["key"] for t in tasks]
        is_join = bool(earlier) and draw(st.integers(0, 9)) < 3
        if is_join:
            after = draw(st.lists(st.sampled_from(earlier), min_size=1, max_size=min(4, len(earlier)), unique=True))
            mode = draw(st.sampled_from(["all", "any", "quorum"]))
            spec: dict[str, Any] = {"key": key, "kind": "join", "mode": mode, "after": after}
            if mode == "quorum":
                spec["quorum"] = draw(st.integers(1, len(after)))
        else:
            after = draw(st.lists(st.sampled_from(earlier), max_size=min(3, len(earlier)), unique=True)) if earlier else []
            outcome = draw(st.sampled_from(["ok", "ok", "fail", "flaky"]))
            if outcome == "ok":
                tool, args = "test.echo", {"value": index}
            elif outcome == "fail":
                tool, args = "test.fail", {"error": "tool_failed", "detail": "no"}
            else:
                tool, args = "test.flaky", {"fail_times": 1, "id": uuid.uuid4().hex}
            spec = {"key": key, "kind": "tool", "tool": tool, "args": args, "after": after}
        spec["on_failure"] = draw(st.sampled_from(POLICIES))
        tasks.append(spec)
    return tasks


def rows_candidates(run: Run) -> list[str]:
    """S15-S16 computed independently from the rows (the trace-based rule must agree)."""
    rows = {t.key: t for t in Task.objects.filter(run=run)}
    consumers: dict[str, list[Task]] = {}
    for task in rows.values():
        for source in task.after:
            consumers.setdefault(source, []).append(task)

    def race_absorbed(key: str) -> bool:
        own = consumers.get(key, [])
        return bool(own) and all(
            (c.kind == "join" and c.spec.get("mode") in ("any", "quorum") and c.status in graph.SETTLED_STATUSES)
            or (c.status == "canceled" and c.error_key == "join_loser_canceled")
            for c in own
        )

    return sorted(
        t.key
        for t in rows.values()
        if t.status in graph.FAILED_STATUSES
        and t.failure_resolution is None
        and (t.on_failure != "absorb" or t.status == "uncertain")
        and not ((t.on_failure == "halt" or t.status == "uncertain") and race_absorbed(t.key))
    )


def check_invariants(run: Run) -> None:
    run.refresh_from_db()
    rows = {t.key: t for t in Task.objects.filter(run=run)}
    events = trace(run)

    # The trace replayed reproduces every task's status.
    replayed = graph.replay(events)
    assert {k: t.status for k, t in replayed.items()} == {k: t.status for k, t in rows.items()}

    # No task starts before its sources settle into something it may run after.
    state: dict[str, graph.TraceTask] = {}
    for event in events:
        key = event["task"]
        if key is None:
            continue
        if event["event"] == "task_added":
            state.update(graph.replay([event]))
            continue
        if event["event"] == "status" and event["to"] in ("running", "dispatched", "awaiting_input", "needs_approval"):
            task = state[key]
            if task.kind != "join":
                for source in task.after:
                    s = state[source]
                    assert graph.source_state(s.status, s.on_failure, s.failure_resolution) == "ok", (
                        f"{key} started while its source {source} was {s.status}"
                    )
        state.update({key: _apply(state[key], event)})

    # Every skipped task has a failed, skipped or canceled ancestor.
    def has_bad_ancestor(key: str, seen: set[str]) -> bool:
        for source in rows[key].after:
            if source in seen:
                continue
            seen.add(source)
            if rows[source].status in ("failed", "timed_out", "uncertain", "skipped", "canceled") or has_bad_ancestor(
                source, seen
            ):
                return True
        return False

    for key, task in rows.items():
        if task.status == "skipped":
            assert has_bad_ancestor(key, set()), f"{key} was skipped with no failed or skipped ancestor"
        assert task.kind != "join" or task.status in ("waiting", "completed", "canceled", "skipped")

    # Candidates from the trace match the rule computed from the rows.
    assert sorted(candidates(run)) == rows_candidates(run)

    # A quiescent run is held or finished, never both.
    busy = any(t.status in graph.LIVE_STATUSES or (t.status == "waiting" and t.ready) for t in rows.values())
    if not busy:
        assert run.status in ("needs_attention", "completed", "canceled"), run.status
        assert (run.attention is not None) == (run.status == "needs_attention")
        if run.status == "completed":
            assert rows[run.deliverable].status == "completed"
        if run.status == "needs_attention" and run.attention["reason"] == "halt_failure":
            pending = [k for k, t in rows.items() if graph.is_pending_failure(t.status, t.on_failure, t.failure_resolution)]
            assert sorted(run.attention["blocked_task_keys"]) == sorted(pending)


def _apply(task: graph.TraceTask, event: dict[str, Any]) -> graph.TraceTask:
    replayed = graph.replay(
        [
            {
                "task": task.key,
                "event": "task_added",
                "to": task.status,
                "data": {"kind": task.kind, "after": task.after, "on_failure": task.on_failure, "mode": task.mode},
            },
            event,
        ]
    )[task.key]
    if event["event"] != "resolved":
        replayed.failure_resolution = task.failure_resolution if event["to"] not in graph.FAILED_STATUSES else None
    if event["event"] != "status":
        replayed.error_key = task.error_key
    return replayed


@pytest.mark.thorough
@pytest.mark.spec("S11", "S12", "S13", "S15", "S16", "S17", "S18")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(tasks=graphs(), data=st.data())
def test_it_keeps_its_invariants_on_random_graphs(team: Team, tasks: list[dict[str, Any]], data: Any) -> None:
    operator = team.users["operator"]
    deliverable = data.draw(st.sampled_from([t["key"] for t in tasks]))
    run, _ = kernel.create_run(workspace=team.workspace, user=operator, body={"tasks": tasks, "deliverable": deliverable})
    run = drive(run)
    check_invariants(run)
    for _ in range(3):
        run.refresh_from_db()
        choices = candidates(run)
        if run.status != "needs_attention" or not choices:
            break
        key = data.draw(st.sampled_from(sorted(choices)))
        verb = data.draw(st.sampled_from([kernel.retry, kernel.abandon]))
        verb(run_id=run.pk, key=key, user=operator)
        run = drive(run)
        check_invariants(run)
