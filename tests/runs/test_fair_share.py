"""One workspace cannot take every worker (issue 27 item 3): its tool calls and model rounds hold
at most OZ0_WORKER_SLOTS_PER_WORKSPACE worker processes; a call over the share stays queued and
its message goes behind the other workspaces' messages."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.utils import timezone

from runs import kernel
from runs.models import TASK_SETTLED, Run, Task, TaskStatus
from runs.worker import tasks as worker_tasks
from runs.worker.reporting import settle
from tests.conftest import LiveStack, Team, wait_for
from tests.runs.driver import echo


def sleeping(key: str, seconds: float) -> dict[str, Any]:
    return {"key": key, "kind": "tool", "tool": "test.sleep", "args": {"seconds": seconds}, "after": []}


def scripted_round(key: str) -> dict[str, Any]:
    return {"key": key, "kind": "round", "model": "script", "prompt": "go", "script": [{"text": "ok"}], "after": []}


def _queued(team: Team, tasks: list[dict[str, Any]]) -> list[Task]:
    run, _ = kernel.create_run(workspace=team.workspace, user=team.users["operator"], body={"tasks": tasks})
    return list(Task.objects.filter(run=run, status=TaskStatus.WAITING, ready=True).order_by("key"))


@pytest.mark.django_db
@pytest.mark.usefixtures("no_dispatch")
@pytest.mark.parametrize("make", [sleeping, scripted_round], ids=["tool calls", "model rounds"])
def test_a_workspace_at_its_share_gets_no_room_while_another_gets_a_worker(make: Any) -> None:
    """Before, every claim succeeded: four slow calls of one workspace held every worker."""
    noisy, quiet = Team(), Team()
    args = (make("a", 30), make("b", 30)) if make is sleeping else (make("a"), make("b"))
    first, second = _queued(noisy, list(args))
    [other] = _queued(quiet, [args[0]])

    taken = kernel.claim_task(str(first.run_id), first.pk, "w1", per_workspace=1)
    assert isinstance(taken, kernel.Claimed)
    assert kernel.claim_task(str(second.run_id), second.pk, "w2", per_workspace=1) is kernel.NO_ROOM
    assert isinstance(kernel.claim_task(str(other.run_id), other.pk, "w3", per_workspace=1), kernel.Claimed)
    second.refresh_from_db()
    assert (second.status, second.ready, second.claim) == (TaskStatus.WAITING, True, None)
    # Without a share (the session worker, tests' drivers) nothing changes.
    assert isinstance(kernel.claim_task(str(second.run_id), second.pk, "w4"), kernel.Claimed)


@pytest.mark.django_db
@pytest.mark.usefixtures("no_dispatch")
def test_a_chunk_of_quick_calls_holds_one_worker_whatever_its_size() -> None:
    noisy = Team()
    tasks = _queued(noisy, [echo(f"e{i}") for i in range(5)])
    claimed = kernel.claim_batch(str(tasks[0].run_id), [t.pk for t in tasks], "chunk")
    assert len(claimed) == 5
    assert kernel.workers_held(noisy.workspace.pk) == 1


@pytest.mark.usefixtures("committed")
def test_a_call_over_its_share_waits_queued_and_is_sent_when_a_worker_of_its_workspace_comes_free(
    settings: Any, no_dispatch: list[int]
) -> None:
    settings.OZ0_WORKER_SLOTS_PER_WORKSPACE = 1
    noisy, quiet = Team(), Team()
    holding, waiting, after = _queued(noisy, [sleeping("a", 30), sleeping("b", 0), sleeping("c", 0)])
    held = kernel.claim_task(str(holding.run_id), holding.pk, "w1", per_workspace=1)
    assert isinstance(held, kernel.Claimed)
    [quiet_call] = _queued(quiet, [sleeping("q", 0)])
    no_dispatch.clear()
    before = timezone.now()

    worker_tasks.execute_task.run(waiting.pk, str(waiting.run_id))  # no room: acknowledged, not sent again
    worker_tasks.execute_task.run(quiet_call.pk, str(quiet_call.run_id))  # another workspace: runs

    waiting.refresh_from_db()
    quiet_call.refresh_from_db()
    assert (waiting.status, waiting.ready, waiting.queued_at >= before) == (TaskStatus.WAITING, True, True)
    assert quiet_call.status == TaskStatus.COMPLETED
    assert no_dispatch == []  # the quiet call's worker sent nothing of the noisy workspace
    assert kernel.send_within_share(str(holding.run_id), 1) == []  # still no room

    assert settle(kernel.task_complete, held, 30)
    assert kernel.send_within_share(str(holding.run_id), 1) == [waiting.pk]  # the oldest first
    assert no_dispatch == [waiting.pk]
    # The worker that ran a call hands its workspace's next one on by itself.
    worker_tasks.execute_task.run(waiting.pk, str(waiting.run_id))
    waiting.refresh_from_db()
    assert waiting.status == TaskStatus.COMPLETED
    assert no_dispatch == [waiting.pk, after.pk]


@pytest.mark.live
@pytest.mark.slow
def test_slow_calls_of_one_workspace_do_not_delay_anothers_quick_call(live: LiveStack, live_team: Team) -> None:
    """Before, four slow calls took both worker processes and the quick call waited for them (0.39 s to 29 s).
    Six slow calls: more than the stack's four worker processes, so only the share keeps one free."""
    from django.conf import settings

    quiet = Team()
    # Far longer than a quick call takes even on a machine whose cores are all busy: the proof is
    # that the quick call ends while every slow one still runs, not a figure of seconds.
    slow = 30.0
    operator = live_team.users["operator"]
    noisy_run, _ = kernel.create_run(
        workspace=live_team.workspace, user=operator, body={"tasks": [sleeping(f"s{i}", slow) for i in range(6)]}
    )
    try:
        wait_for(lambda: Task.objects.filter(run=noisy_run, status=TaskStatus.RUNNING).exists(), message="a slow call")
        time.sleep(0.5)  # the other worker process has met the noisy workspace's other messages
        quick_run, _ = kernel.create_run(
            workspace=quiet.workspace, user=quiet.users["operator"], body={"tasks": [echo("q")], "deliverable": "q"}
        )
        wait_for(lambda: Run.objects.get(pk=quick_run.pk).status == "completed", timeout=60, message="the quick run")
        ended = Task.objects.filter(run=noisy_run, status__in=TASK_SETTLED).count()
        assert ended == 0, f"the quiet workspace's quick call waited for {ended} of the other's {slow:.0f} s calls to end"
        # The noisy workspace never held more than its share of the workers.
        assert Task.objects.filter(run=noisy_run, status=TaskStatus.RUNNING).count() <= settings.OZ0_WORKER_SLOTS_PER_WORKSPACE
    finally:
        # Its calls left queued would be sent again to the next test's worker by the lost-message sweep.
        kernel.cancel_run(run_id=noisy_run.pk, user=operator, reason="test over")


@pytest.mark.django_db
@pytest.mark.usefixtures("no_dispatch")
@pytest.mark.spec("S16")
def test_the_default_share_runs_a_join_anys_slow_and_fast_branches_at_once() -> None:
    """Before, the default install (two workers, a share of one) let a join-any's slow branch take
    the workspace's only worker first: the fast one waited 30 s behind it and the race was lost
    by the wrong branch (the conformance scenario join-any-cancels-losers, failed in CI)."""
    from django.conf import settings

    team = Team()
    slow, fast = _queued(team, [sleeping("a_slow", 30), sleeping("b_fast", 0.1)])
    share = int(settings.OZ0_WORKER_SLOTS_PER_WORKSPACE)
    assert isinstance(kernel.claim_task(str(slow.run_id), slow.pk, "w1", per_workspace=share), kernel.Claimed)
    assert isinstance(kernel.claim_task(str(fast.run_id), fast.pk, "w2", per_workspace=share), kernel.Claimed)
