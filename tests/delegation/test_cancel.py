"""Cancel both ways (F16): a parent's cancel reaches every running child, recursively, and the
parent stays canceling until they have ended; a child canceled on its own is an answer for the
Ask agent and a quarantine and fails the parent under oz.delegate; the race between the two is
decided once, under the parent's lock."""

from __future__ import annotations

from typing import Any

import pytest

from runs import kernel
from runs.kernel import KernelError
from runs.models import Run, TraceEvent
from tests.conftest import Team
from tests.delegation.tree import agent, child_of, create, drive_tree, requests, tool_answer
from tests.runs.driver import drive, step, task

SLEEP = "  - tool_calls: [{tool: test.sleep, args: {seconds: 30}}]\n  - text: slept\n"


def sleeper(team: Team) -> str:
    return agent(
        team.workspace, f"model: script\ntools: [test.sleep]\napproval: {{mode: bypass}}\nscript:\n{SLEEP}", prefix="sleeper"
    )


def delegating(team: Team, tool: str, args: str, *, prefix: str = "boss") -> str:
    return agent(
        team.workspace,
        f"model: script\ntools: [{tool}]\napproval: {{mode: bypass}}\nscript:\n"
        f"  - tool_calls: [{{tool: {tool}, args: {args}}}]\n  - text: went on\n",
        prefix=prefix,
    )


def provider_calls(run: Run) -> int:
    return TraceEvent.objects.filter(run=run, event="provider_call").count()


@pytest.mark.spec("F16")
@pytest.mark.usefixtures("no_dispatch")
def test_a_parent_cancel_reaches_a_sleeping_grandchild_and_waits_for_it(
    team: Team, django_capture_on_commit_callbacks: Any
) -> None:
    capture = django_capture_on_commit_callbacks
    middle = delegating(team, "oz.delegate", f"{{agent: {sleeper(team)}}}", prefix="middle")
    parent = create(team.workspace, team.users["operator"], agent=delegating(team, "oz.delegate", f"{{agent: {middle}}}"))
    with capture(execute=True):
        drive(parent)
    child = child_of(parent, "r1.1")
    with capture(execute=True):
        drive(child)
    grandchild = child_of(child, "r1.1")
    with capture(execute=True):
        step(grandchild, task(grandchild, "r1"))
    claimed = kernel.claim_task(grandchild.pk, task(grandchild, "r1.1").pk, "sleeping-worker")
    assert claimed is not None

    with capture(execute=True):
        kernel.cancel_run(run_id=parent.pk, user=team.users["operator"], reason="stop everything")
    for run in (parent, child, grandchild):
        run.refresh_from_db()
    # The cancel reached the grandchild, whose worker is told to stop; nobody above it has ended.
    assert (parent.status, child.status, grandchild.status) == ("canceling", "canceling", "canceling")
    assert task(grandchild, "r1.1").cancel_requested is True
    assert kernel.heartbeat("sleeping-worker") is True
    assert task(parent, "r1.1").status == "running"

    with capture(execute=True):
        kernel.task_stopped(claimed)
    for run in (parent, child, grandchild):
        run.refresh_from_db()
    assert (parent.status, child.status, grandchild.status) == ("canceled", "canceled", "canceled")
    assert parent.failure["kind"] == "cancelled" and parent.failure["message"] == "stop everything"
    # The parent never went on from its child's cancellation: no later round ran.
    assert task(parent, "r1").status == "canceled"
    assert provider_calls(parent) == 1
    ended = TraceEvent.objects.get(run=parent, event="child_ended")
    assert ended.data["decided"] == "parent_canceled" and ended.data["kind"] == "cancelled"
    assert task(parent, "r1.1").status == "canceled"


@pytest.mark.spec("F16", "F14")
@pytest.mark.usefixtures("no_dispatch")
@pytest.mark.parametrize(
    ("tool", "args"),
    [("oz.ask_agent", "question: 'how long?'"), ("oz.quarantine", "output_schema: {type: string}"), ("oz.delegate", "")],
)
def test_a_child_canceled_on_its_own(team: Team, django_capture_on_commit_callbacks: Any, tool: str, args: str) -> None:
    capture = django_capture_on_commit_callbacks
    name = sleeper(team)
    parent = create(
        team.workspace, team.users["operator"], agent=delegating(team, tool, f"{{agent: {name}{', ' + args if args else ''}}}")
    )
    with capture(execute=True):
        drive(parent)
    child = child_of(parent, "r1.1")
    with capture(execute=True):
        step(child, task(child, "r1"))
        kernel.cancel_run(run_id=child.pk, user=team.users["operator"], reason="not this one")
    parent = drive_tree(parent, capture)
    child.refresh_from_db()
    assert child.status == "canceled" and child.failure["kind"] == "cancelled"
    delegate = task(parent, "r1.1")
    assert (delegate.status, delegate.error_key) == ("failed", "child_failed")
    if tool == "oz.delegate":
        # Under oz.delegate the child's own cancellation fails the parent, which does not go on.
        assert parent.status == "canceled" and parent.failure["kind"] == "cancelled"
        assert provider_calls(parent) == 1
        assert TraceEvent.objects.get(run=parent, event="child_ended").data["decided"] == "fails_parent"
    else:
        # For the Ask agent and a quarantine it is the tool's answer, with kind cancelled.
        assert parent.status == "completed" and parent.output == "went on"
        label = tool_answer(requests(parent)[1], tool)["label"]
        assert label["failed"] is True and label["kind"] == "cancelled"
        if tool == "oz.quarantine":
            assert "message" not in label and "not this one" not in str(requests(parent))


def race(*contenders: Any) -> list[Any]:
    import threading

    from django.db import connection

    barrier = threading.Barrier(len(contenders))
    results: list[Any] = [None] * len(contenders)

    def run(index: int, contender: Any) -> None:
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


@pytest.mark.spec("F16")
@pytest.mark.usefixtures("committed", "no_dispatch")
def test_the_parent_cancel_and_the_childs_own_cancel_race_is_decided_once() -> None:
    team = Team()
    name = sleeper(team)
    operator = team.users["operator"]
    outcomes = set()
    for _ in range(6):
        parent = create(team.workspace, operator, tasks=[{"key": "d", "kind": "delegate", "agent": name}])
        child = child_of(parent, "d")
        results = race(
            lambda parent=parent: kernel.cancel_run(run_id=parent.pk, user=operator, reason="parent stop"),
            lambda child=child: kernel.cancel_run(run_id=child.pk, user=operator, reason="child stop"),
        )
        kernel.sweep_delegations()  # nothing is left for it when the after-commit deliveries did their work
        parent.refresh_from_db()
        child.refresh_from_db()
        assert (parent.status, child.status) == ("canceled", "canceled")
        ended = list(TraceEvent.objects.filter(run=parent, event="child_ended"))
        assert len(ended) == 1, "the child's end is decided once"
        decided = ended[0].data["decided"]
        outcomes.add(decided)
        verbs = list(TraceEvent.objects.filter(run=parent, event="verb", data__verb="cancel"))
        if decided == "parent_canceled":
            # The parent's cancel took the lock first: its own failure stands, the child's is not read.
            assert not isinstance(results[0], KernelError)
            assert verbs[0].seq < ended[0].seq and parent.failure["message"] == "parent stop"
            assert task(parent, "d").status == "canceled"
        else:
            # The child's end took the lock first: under oz.delegate it failed the parent, and the
            # person's cancel found the parent already stopping.
            assert decided == "fails_parent"
            assert isinstance(results[0], KernelError) and results[0].key in ("run_canceling", "run_finished")
            assert task(parent, "d").error_key == "child_failed" and parent.failure["kind"] == "cancelled"
    assert outcomes <= {"parent_canceled", "fails_parent"}


@pytest.mark.spec("F16", "F17")
@pytest.mark.usefixtures("no_dispatch")
def test_a_flow_canceled_on_its_own_is_the_flow_tools_answer(team: Team, django_capture_on_commit_callbacks: Any) -> None:
    capture = django_capture_on_commit_callbacks
    flow = agent(team.workspace, f"kind: flow\nsteps:\n  - id: nap\n    agent: {sleeper(team)}\n", prefix="flow")
    parent = create(team.workspace, team.users["operator"], agent=delegating(team, "oz.flow", f"{{flow: {flow}}}"))
    with capture(execute=True):
        drive(parent)
    child = child_of(parent, "r1.1")
    grandchild = child_of(child, "nap")
    with capture(execute=True):
        kernel.cancel_run(run_id=child.pk, user=team.users["operator"], reason="not now")
    parent = drive_tree(parent, capture)
    child.refresh_from_db()
    grandchild.refresh_from_db()
    # The flow's cancel reached its step's run; the flow's own cancellation is the parent's answer.
    assert (child.status, grandchild.status) == ("canceled", "canceled")
    assert (parent.status, parent.output) == ("completed", "went on")
    label = tool_answer(requests(parent)[1], "oz.flow")["label"]
    assert label["failed"] is True and label["kind"] == "cancelled" and label["words_of"] == f"the agent {flow} (job {child.pk})"
