"""The repair and control verbs (S14-S17, S28, S29), driven through the kernel in-process."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from runs import kernel
from runs.kernel import Conflict, Forbidden, NotFound
from runs.models import Finding, Run, TraceEvent
from runs.selectors import candidates
from tests.conftest import Team
from tests.runs.driver import drive, echo, fail, queued, statuses, task


def create(team: Team, tasks: list[dict[str, Any]], deliverable: str, **body: Any) -> Run:
    run, _ = kernel.create_run(
        workspace=team.workspace, user=team.users["operator"], body={"tasks": tasks, "deliverable": deliverable, **body}
    )
    return run


def flaky(key: str, fail_times: int = 1, **fields: Any) -> dict[str, Any]:
    return {
        "key": key,
        "kind": "tool",
        "tool": "test.flaky",
        "args": {"fail_times": fail_times, "id": uuid.uuid4().hex},
        **fields,
    }


@pytest.mark.spec("S13", "S14")
def test_it_retries_a_halted_task_under_its_own_lineage(team: Team) -> None:
    run = drive(create(team, [flaky("a", on_failure="halt"), echo("c", 5, after=["a"])], "c"))
    assert run.status == "needs_attention"
    run = kernel.retry(run_id=run.pk, key="a", user=team.users["operator"])
    assert run.status == "running" and run.attention is None
    run = drive(run)
    a = task(run, "a")
    assert run.status == "completed" and run.output == 5
    assert a.status == "completed" and a.attempt == 2 and a.lineage == "a" and a.error_key is None


@pytest.mark.spec("S14", "S15")
def test_it_retries_a_propagated_failure_and_revives_what_it_skipped(team: Team) -> None:
    run = drive(create(team, [flaky("a"), echo("b", after=["a"]), echo("c", 3, after=["b"])], "c"))
    assert statuses(run) == {"a": "failed", "b": "skipped", "c": "skipped"}
    assert candidates(run) == ["a"]
    run = drive(kernel.retry(run_id=run.pk, key="a", user=team.users["operator"]))
    assert run.status == "completed" and run.output == 3


@pytest.mark.spec("S14", "S19")
def test_it_abandons_a_failure_and_skips_its_dependents(team: Team) -> None:
    run = drive(create(team, [fail("a", on_failure="halt"), echo("c", after=["a"]), echo("d", 9)], "d"))
    assert run.status == "needs_attention"
    run = drive(kernel.abandon(run_id=run.pk, key="a", user=team.users["operator"]))
    assert run.status == "completed" and run.output == 9
    assert task(run, "a").failure_resolution == "abandoned"
    assert statuses(run)["c"] == "skipped"
    with pytest.raises(Conflict):
        kernel.retry(run_id=run.pk, key="a", user=team.users["operator"])


@pytest.mark.spec("S15")
def test_it_refuses_retry_of_a_task_that_is_not_a_candidate(team: Team) -> None:
    run = drive(create(team, [echo("a"), fail("h", on_failure="halt")], "a"))
    for key in ("a", "missing"):
        with pytest.raises((Conflict, NotFound)):
            kernel.retry(run_id=run.pk, key=key, user=team.users["operator"])
    before = TraceEvent.objects.filter(run=run).count()
    with pytest.raises(Conflict):
        kernel.abandon(run_id=run.pk, key="a", user=team.users["operator"])
    assert TraceEvent.objects.filter(run=run).count() == before


@pytest.mark.spec("S15")
def test_it_computes_candidates_from_the_trace_not_blocked_keys(team: Team) -> None:
    run = drive(
        create(
            team, [fail("p"), fail("h", on_failure="halt"), fail("x", on_failure="absorb"), echo("d", after=["p", "h", "x"])], "d"
        )
    )
    assert run.attention["reason"] == "halt_failure"
    assert run.attention["blocked_task_keys"] == ["h"]
    assert sorted(candidates(run)) == ["h", "p"]


@pytest.mark.spec("S32")
def test_it_requires_write_standing_for_every_verb(team: Team) -> None:
    run = drive(create(team, [fail("a", on_failure="halt")], "a"))
    for role in ("viewer", "reader"):
        with pytest.raises(Forbidden):
            kernel.retry(run_id=run.pk, key="a", user=team.users[role])
        with pytest.raises(Forbidden):
            kernel.cancel_run(run_id=run.pk, user=team.users[role], reason="no")
    with pytest.raises(NotFound):
        kernel.abandon(run_id=run.pk, key="a", user=team.users["outsider"])


@pytest.mark.spec("S29", "F1")
def test_it_cancels_unstarted_work_and_fails_the_run_as_cancelled(team: Team) -> None:
    run = create(team, [echo("a"), echo("b", after=["a"])], "b")
    run = kernel.cancel_run(run_id=run.pk, user=team.users["operator"], reason="wrong input")
    assert run.status == "canceled"
    assert statuses(run) == {"a": "canceled", "b": "canceled"}
    assert task(run, "b").error_key == "run_canceled"
    assert run.failure["kind"] == "cancelled" and run.failure["message"] == "wrong input"
    assert run.error == "canceled"
    finding = Finding.objects.get(run_id=run.pk)
    assert finding.kind == "cancelled"


@pytest.mark.spec("S29", "F1")
def test_it_waits_for_in_flight_work_before_a_cancel_completes(team: Team) -> None:
    run = create(team, [echo("a"), echo("b", after=["a"])], "b")
    claimed = kernel.claim_task(None, task(run, "a").pk, "w1")
    assert claimed is not None
    run = kernel.cancel_run(run_id=run.pk, user=team.users["operator"], reason="stop")
    assert run.status == "canceling"
    assert task(run, "a").cancel_requested
    assert kernel.heartbeat("w1") is True
    kernel.task_stopped(claimed)
    run.refresh_from_db()
    assert run.status == "canceled"
    assert statuses(run) == {"a": "canceled", "b": "canceled"}


@pytest.mark.spec("S29", "F1")
def test_it_fails_a_canceled_held_run_with_the_holds_kind(team: Team) -> None:
    run = drive(create(team, [fail("a", on_failure="halt", error="tool_timeout"), echo("c", after=["a"])], "c"))
    run = kernel.cancel_run(run_id=run.pk, user=team.users["operator"], reason="giving up")
    assert run.failure == {
        "kind": "timeout",
        "retryable": True,
        "partial": True,
        "person": False,
        "message": "giving up",
        "declared": False,
    }
    finding = Finding.objects.get(run_id=run.pk)
    assert (finding.step_key, finding.error_key, finding.attempts) == ("a", "tool_timeout", 1)


@pytest.mark.spec("S29")
def test_it_refuses_a_second_cancel(team: Team) -> None:
    run = create(team, [echo("a")], "a")
    kernel.cancel_run(run_id=run.pk, user=team.users["operator"], reason="")
    with pytest.raises(Conflict) as refused:
        kernel.cancel_run(run_id=run.pk, user=team.users["operator"], reason="")
    assert refused.value.key == "run_finished"


@pytest.mark.spec("S29")
def test_it_pauses_dispatch_and_resumes_it(team: Team) -> None:
    run = create(team, [echo("a"), echo("b", after=["a"])], "b")
    drive_one = queued(run)[0]
    kernel.pause_run(run_id=run.pk, user=team.users["operator"])
    assert kernel.claim_task(None, drive_one.pk, "w") is None
    run.refresh_from_db()
    assert run.status == "paused"
    with pytest.raises(Conflict):
        kernel.pause_run(run_id=run.pk, user=team.users["operator"])
    run = drive(kernel.resume_run(run_id=run.pk, user=team.users["operator"]))
    assert run.status == "completed"


@pytest.mark.spec("S8", "S20")
def test_it_dispatches_a_client_await_with_a_token_and_never_announces_it(team: Team) -> None:
    run, receipt = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={"tasks": [{"key": "q", "kind": "await", "question": "ok?"}, echo("b", 3, after=["q"])], "deliverable": "b"},
    )
    assert set(receipt["tokens"]) == {"q"}
    run.refresh_from_db()
    assert task(run, "q").status == "dispatched"
    assert run.attention is None and run.announcements == []
    with pytest.raises(NotFound):
        kernel.resolve_await(token="not-a-token", user=team.users["operator"], value=1)
    kernel.resolve_await(token=receipt["tokens"]["q"], user=team.users["operator"], value="yes")
    with pytest.raises(Conflict):
        kernel.resolve_await(token=receipt["tokens"]["q"], user=team.users["operator"], value="again")
    assert drive(run).status == "completed"


@pytest.mark.spec("S6", "S9")
def test_it_times_out_an_await_with_a_clock(team: Team) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from runs.kernel import sweep_clocks

    run = create(team, [{"key": "q", "kind": "await", "question": "?", "timeout_s": 60, "on_failure": "halt"}], "q")
    sweep_clocks(timezone.now() + timedelta(seconds=30))
    assert task(run, "q").status == "dispatched"
    sweep_clocks(timezone.now() + timedelta(seconds=61))
    q = task(run, "q")
    assert q.status == "timed_out" and q.error_key == "await_timeout"
    run.refresh_from_db()
    assert run.status == "needs_attention"


@pytest.mark.spec("S28")
def test_it_reruns_a_failed_model_step_within_the_retry_budget(team: Team) -> None:
    script = [{"tool_calls": [{"tool": "no.such_tool", "args": {}}]}, {"text": "second try"}]
    round_ = {"key": "r1", "kind": "round", "model": "script", "prompt": "go", "script": script}
    run = drive(create(team, [round_], "r1", retry={"budget": 1}, approval={"mode": "bypass"}))
    assert run.status == "completed" and run.output == "second try"
    assert TraceEvent.objects.filter(run=run, event="auto_retry").count() == 1


@pytest.mark.spec("S28")
def test_it_applies_the_policy_once_the_retry_budget_is_spent(team: Team) -> None:
    script = [{"tool_calls": [{"tool": "no.such_tool"}]}, {"tool_calls": [{"tool": "no.such_tool"}]}]
    round_ = {"key": "r1", "kind": "round", "model": "script", "prompt": "go", "script": script, "on_failure": "halt"}
    run = drive(create(team, [round_], "r1", retry={"budget": 1}, approval={"mode": "bypass"}))
    assert run.status == "needs_attention"
    assert task(run, "r1").error_key == "round_expansion_refused"
