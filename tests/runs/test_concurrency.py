"""Races decided once: each contender runs in its own thread with its own database connection."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from runs import kernel
from runs.kernel import KernelError
from runs.models import Run, TraceEvent
from tests.conftest import Team
from tests.runs.driver import drive, echo, fail, join, task

pytestmark = pytest.mark.usefixtures("committed", "no_dispatch")


def race(*contenders: Callable[[], Any]) -> list[Any]:
    """Start every contender at the same barrier; collect results or the KernelError each raised."""
    barrier = threading.Barrier(len(contenders))
    results: list[Any] = [None] * len(contenders)

    def run(index: int, contender: Callable[[], Any]) -> None:
        try:
            barrier.wait()
            results[index] = contender()
        except KernelError as error:
            results[index] = error
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


def create(team: Team, tasks: list[dict[str, Any]], deliverable: str, **body: Any) -> Run:
    run, _ = kernel.create_run(
        workspace=team.workspace, user=team.users["operator"], body={"tasks": tasks, "deliverable": deliverable, **body}
    )
    return run


def status_events(run: Run, key: str, to: str) -> int:
    return TraceEvent.objects.filter(run=run, task_key=key, event="status", to_status=to).count()


@pytest.mark.spec("S16", "S29")
def test_it_releases_a_join_once_when_two_completions_race() -> None:
    team = Team()
    for _ in range(5):
        run = create(team, [echo("a"), echo("b"), join("j", ["a", "b"])], "j")
        a = kernel.claim_task(None, task(run, "a").pk, "wa")
        b = kernel.claim_task(None, task(run, "b").pk, "wb")
        assert a and b
        race(lambda a=a: kernel.task_complete(a, 1), lambda b=b: kernel.task_complete(b, 2))
        run.refresh_from_db()
        assert run.status == "completed"
        assert status_events(run, "j", "completed") == 1
        assert TraceEvent.objects.filter(run=run, event="run_status", to_status="completed").count() == 1


@pytest.mark.spec("S16")
def test_it_settles_an_any_join_once_when_two_winners_race() -> None:
    team = Team()
    run = create(team, [echo("a"), echo("b"), join("j", ["a", "b"], "any")], "j")
    a = kernel.claim_task(None, task(run, "a").pk, "wa")
    b = kernel.claim_task(None, task(run, "b").pk, "wb")
    assert a and b
    outcomes = race(lambda: kernel.task_complete(a, "A"), lambda: kernel.task_complete(b, "B"))
    run.refresh_from_db()
    assert status_events(run, "j", "completed") == 1
    # The loser of the race was canceled after the join settled, so its report found its claim gone.
    assert sorted(outcomes) == [False, True]
    assert run.status == "completed" and run.output in ("A", "B")


@pytest.mark.spec("S29")
def test_it_decides_a_cancel_racing_a_completion_once() -> None:
    team = Team()
    for _ in range(5):
        run = create(team, [echo("a"), echo("b", after=["a"])], "b")
        claimed = kernel.claim_task(None, task(run, "a").pk, "w")
        assert claimed
        race(
            lambda claimed=claimed: kernel.task_complete(claimed, 1),
            lambda run=run: kernel.cancel_run(run_id=run.pk, user=team.users["operator"], reason="stop"),
        )
        run.refresh_from_db()
        if run.status == "canceling":
            # The completion won; b was canceled unstarted... or b became ready first and is queued: stop it.
            kernel.task_stopped(claimed)
            run.refresh_from_db()
        assert run.status == "canceled"
        assert task(run, "b").status == "canceled"
        assert status_events(run, "a", "completed") + status_events(run, "a", "canceled") == 1


@pytest.mark.spec("S14", "S15")
def test_it_lets_one_of_two_operators_retry() -> None:
    team = Team()
    run = drive(create(team, [fail("a", on_failure="halt"), echo("b", after=["a"])], "b"))
    assert run.status == "needs_attention"
    outcomes = race(
        lambda: kernel.retry(run_id=run.pk, key="a", user=team.users["operator"]),
        lambda: kernel.retry(run_id=run.pk, key="a", user=team.users["operator"]),
    )
    errors = [o for o in outcomes if isinstance(o, KernelError)]
    assert len(errors) == 1 and errors[0].key == "not_a_candidate" and errors[0].status == 409
    assert TraceEvent.objects.filter(run=run, event="verb", data__verb="retry").count() == 1


@pytest.mark.spec("S5", "S6")
def test_it_decides_twenty_simultaneous_approvals_once() -> None:
    team = Team()
    script = [{"tool_calls": [{"tool": "test.echo", "args": {"value": 1}}]}, {"text": "done"}]
    run = create(
        team,
        [{"key": "r1", "kind": "round", "model": "script", "prompt": "go", "script": script}],
        "r1",
        approval={"mode": "ask"},
    )
    drive(run)
    assert task(run, "r1.1").status == "needs_approval"
    outcomes = race(*[lambda: kernel.approve(run_id=run.pk, key="r1.1", user=team.users["operator"]) for _ in range(20)])
    assert sum(1 for o in outcomes if not isinstance(o, KernelError)) == 1
    assert all(o.key == "not_pending" for o in outcomes if isinstance(o, KernelError))
    run = drive(run)
    assert run.status == "completed" and run.output == "done"
    assert status_events(run, "r1.1", "running") == 1
