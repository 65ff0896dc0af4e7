"""The approval stage of model-composed tool calls (S4-S6), driven in-process."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.utils import timezone

from runs import kernel
from runs.kernel import sweep_clocks
from runs.models import Run, TraceEvent
from tests.conftest import Team
from tests.runs.driver import drive, statuses, task


def round_calling(*tools: str, then: str = "done", on_failure: str = "propagate") -> dict[str, Any]:
    script = [{"tool_calls": [{"tool": t, "args": {"value": i}} for i, t in enumerate(tools)]}, {"text": then}]
    return {"key": "r1", "kind": "round", "model": "script", "prompt": "go", "script": script, "on_failure": on_failure}


def create(team: Team, approval: dict[str, Any], *tools: str) -> Run:
    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={"tasks": [round_calling(*tools)], "deliverable": "r1", "approval": approval},
    )
    return drive(run)


@pytest.mark.spec("S5")
def test_it_never_rests_a_call_under_bypass(team: Team) -> None:
    run = drive(create(team, {"mode": "bypass"}, "test.echo"))
    assert run.status == "completed"
    assert not TraceEvent.objects.filter(run=run, to_status="needs_approval").exists()
    assert TraceEvent.objects.filter(run=run, task_key="r1.1", event="approval_granted").exists()


@pytest.mark.spec("S4", "S5")
def test_it_rests_a_model_composed_call_under_ask_and_announces_it(team: Team) -> None:
    run = create(team, {"mode": "ask"}, "test.echo")
    assert task(run, "r1.1").status == "needs_approval"
    assert run.status == "running"
    assert run.announcements == ["approval_required"]
    # A model round itself has no stage: it ran without one.
    assert not TraceEvent.objects.filter(run=run, task_key="r1", to_status="needs_approval").exists()


@pytest.mark.spec("S4")
def test_it_lets_client_authored_tool_calls_skip_the_stage(team: Team) -> None:
    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={"tasks": [{"key": "a", "kind": "tool", "tool": "test.echo", "args": {"value": 1}}], "approval": {"mode": "ask"}},
    )
    assert drive(run).status == "completed"


@pytest.mark.spec("S5")
def test_it_lets_rules_decide_and_rests_what_they_do_not(team: Team) -> None:
    approval = {"mode": "rules", "rules": [{"tool": "test.echo", "decision": "allow"}, {"tool": "test.fail", "decision": "deny"}]}
    run = create(team, approval, "test.echo", "test.fail", "test.sleep")
    states = statuses(run)
    assert states["r1.1"] == "completed"
    assert states["r1.2"] == "failed" and task(run, "r1.2").error_key == "approval_denied"
    assert states["r1.3"] == "needs_approval"


@pytest.mark.spec("S6")
def test_it_fails_a_denied_call_under_its_own_policy_and_the_model_reads_it(team: Team) -> None:
    run = create(team, {"mode": "ask"}, "test.echo")
    kernel.deny(run_id=run.pk, key="r1.1", user=team.users["operator"], reason="not today")
    run = drive(run)
    call = task(run, "r1.1")
    assert (call.status, call.error_key, call.failure_resolution) == ("failed", "approval_denied", "absorbed")
    assert run.status == "completed" and run.output == "done"
    history = task(run, "r1").state["history"]
    assert any(m.get("role") == "tool" and m.get("ok") is False and "approval_denied" in m["content"] for m in history)


@pytest.mark.spec("S6")
def test_it_times_out_a_parked_call_on_the_park_clock(team: Team) -> None:
    run = create(team, {"mode": "ask"}, "test.echo")
    sweep_clocks(timezone.now() + timedelta(hours=23))
    assert task(run, "r1.1").status == "needs_approval"
    with time_machine.travel(timezone.now() + timedelta(hours=24, seconds=5), tick=False):
        sweep_clocks()
    call = task(run, "r1.1")
    assert (call.status, call.error_key) == ("timed_out", "approval_expired")
    run = drive(run)
    assert run.status == "completed"


@pytest.mark.spec("S6", "S29")
def test_it_cancels_a_parked_call_with_the_run(team: Team) -> None:
    run = create(team, {"mode": "ask"}, "test.echo")
    run = kernel.cancel_run(run_id=run.pk, user=team.users["operator"], reason="stop")
    call = task(run, "r1.1")
    assert (call.status, call.error_key) == ("canceled", "run_canceled")
    run.refresh_from_db()
    assert run.status == "canceled" and run.announcements == []


@pytest.mark.spec("S9", "S20", "S21")
def test_it_keeps_a_halt_stamp_over_a_later_question(team: Team) -> None:
    ask = {
        "key": "q",
        "kind": "round",
        "model": "script",
        "prompt": "?",
        "script": [{"ask": "which?"}, {"text": "ok"}],
        "after": ["gate"],
    }
    tasks = [
        {"key": "bad", "kind": "tool", "tool": "test.fail", "args": {}, "on_failure": "halt"},
        {"key": "gate", "kind": "await", "question": "go?"},
        ask,
    ]
    run, receipt = kernel.create_run(
        workspace=team.workspace, user=team.users["operator"], body={"tasks": tasks, "deliverable": "q"}
    )
    run = drive(run)
    assert run.attention == {"reason": "halt_failure", "blocked_task_keys": ["bad"], "kinds": ["tool_failed"]}
    kernel.resolve_await(token=receipt["tokens"]["gate"], user=team.users["operator"], value=1)
    run = drive(run)
    assert task(run, "q.1").status == "awaiting_input"
    assert run.status == "running" and "awaiting_human" in run.announcements
    # The standing halt stamp is not replaced by the ask.
    assert run.attention == {"reason": "halt_failure", "blocked_task_keys": ["bad"], "kinds": ["tool_failed"]}
