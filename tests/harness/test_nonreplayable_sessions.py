"""A harnessed round that has made a non-replayable call is itself non-replayable (issue 25, item 9):
its session started over would make the call again. A lost claim leaves it `uncertain` for a person
(never re-run blind), it is not re-run automatically after a crash, and a person's retry is told
which non-replayable calls it already made and must confirm them."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from oz0agents.registry import register
from runs import kernel
from runs.kernel import sweep_expired_claims
from runs.models import Run, Task, TraceEvent
from tests.conftest import Team, wait_for
from tests.harness.conftest import jsonl_manifest, start_run
from tests.runs.driver import drive
from testtools.models import EffectRecord


def _claimed_session(team: Team, name: str) -> tuple[Run, kernel.Claimed]:
    registered = register(jsonl_manifest(name, [], tools=["test.effect", "test.echo"]), workspace=team.workspace)
    run, _ = kernel.create_run(
        workspace=team.workspace, user=team.users["operator"], body={"agent": registered.version.agent.name}
    )
    claimed = kernel.claim_task(run.pk, Task.objects.get(run=run, key="r1").pk, f"session-host:1:{uuid.uuid4().hex[:8]}")
    assert claimed is not None
    return run, claimed


def _call(claimed: kernel.Claimed, tool: str, args: dict[str, Any]) -> str:
    key, refusal = kernel.round_call(claimed, {"tool": tool, "args": args}, allowed_tools=[tool], tool_policies={})
    assert key is not None, refusal
    return key


def _worker_dies(run: Run) -> None:
    """The session worker stops heartbeating (killed); the sweep finds its claim lapsed."""
    sweep_expired_claims(timezone.now() + timedelta(seconds=settings.OZ0_LEASE_SECONDS + 1))
    run.refresh_from_db()


@pytest.mark.spec("F7", "S10")
def test_a_session_that_made_a_non_replayable_call_goes_uncertain_when_its_worker_dies_and_the_call_runs_once(
    harness_team: Team, no_dispatch: list[int]
) -> None:
    effect = uuid.uuid4().hex
    run, claimed = _claimed_session(harness_team, "nr-dies")
    assert _call(claimed, "test.effect", {"id": effect}) == "r1.1"
    drive(run)  # the call runs on a worker of its own, once
    assert EffectRecord.objects.filter(effect_id=effect).count() == 1
    sent_before = list(no_dispatch)
    _worker_dies(run)
    r1 = Task.objects.get(run=run, key="r1")
    assert (r1.status, r1.error_key) == ("uncertain", "round_uncertain"), r1.error_detail
    assert "r1.1 (test.effect, completed)" in r1.error_detail and r1.claim is None
    expired = TraceEvent.objects.get(run=run, task_key="r1", event="claim_expired")
    assert expired.data["replayed"] is False
    assert expired.data["nonreplayable_calls"] == [{"key": "r1.1", "tool": "test.effect", "status": "completed"}]
    # Never re-run blind: nothing was queued again, and no second call was authored or made.
    assert no_dispatch == sent_before and drive(run).status == "needs_attention"
    assert not Task.objects.filter(run=run, key="r1.2").exists()
    assert EffectRecord.objects.filter(effect_id=effect).count() == 1
    assert run.attention["blocked_task_keys"] == ["r1"] and run.failure["kind"] == "unknown_outcome"


@pytest.mark.spec("F7", "S10")
def test_a_session_that_made_only_replayable_calls_is_still_handed_on(harness_team: Team, no_dispatch: list[int]) -> None:
    run, claimed = _claimed_session(harness_team, "nr-replayable")
    _call(claimed, "test.echo", {"value": 1})
    drive(run)
    _worker_dies(run)
    r1 = Task.objects.get(run=run, key="r1")
    assert (r1.status, r1.ready) == ("waiting", True)


@pytest.mark.spec("F7", "S10")
def test_a_call_still_waiting_for_approval_counts_and_a_denied_one_does_not(harness_team: Team, no_dispatch: list[int]) -> None:
    registered = register(
        jsonl_manifest("nr-approval", [], tools=["test.effect"], approval="ask"), workspace=harness_team.workspace
    )
    for decision, expected in (("deny", "waiting"), (None, "uncertain")):
        run, _ = kernel.create_run(
            workspace=harness_team.workspace, user=harness_team.users["operator"], body={"agent": registered.version.agent.name}
        )
        claimed = kernel.claim_task(run.pk, Task.objects.get(run=run, key="r1").pk, f"h:1:{uuid.uuid4().hex[:8]}")
        assert claimed is not None
        _call(claimed, "test.effect", {"id": uuid.uuid4().hex})
        if decision == "deny":
            kernel.deny(run_id=run.pk, key="r1.1", user=harness_team.users["operator"], reason="no")
        _worker_dies(run)
        assert Task.objects.get(run=run, key="r1").status == expected, decision


@pytest.mark.spec("F7", "S10", "S28")
def test_a_crashed_session_that_made_a_non_replayable_call_is_not_rerun_automatically(harness_team: Team) -> None:
    effect = uuid.uuid4().hex
    script = [{"call": "test.effect", "args": {"id": effect}}, {"crash": 3, "stderr": "boom"}]
    run, thread = start_run(harness_team, jsonl_manifest("nr-crash", script, tools=["test.effect"]))
    wait_for(lambda: Task.objects.filter(run=run, key="r1.1").exists(), timeout=30, message="r1.1")
    drive(run)
    thread.join(30)
    run.refresh_from_db()
    r1 = Task.objects.get(run=run, key="r1")
    assert (r1.status, r1.error_key) == ("failed", "harness_crashed")
    assert not TraceEvent.objects.filter(run=run, task_key="r1", event="auto_retry").exists()
    assert r1.state["nonreplayable_calls"] == ["r1.1"]  # carried on by the session's report
    assert run.status == "needs_attention"


@pytest.mark.spec("F7", "S10", "S14")
def test_a_persons_retry_is_told_the_calls_already_made_and_must_confirm_them(harness_team: Team, no_dispatch: list[int]) -> None:
    effect = uuid.uuid4().hex
    run, claimed = _claimed_session(harness_team, "nr-retry")
    _call(claimed, "test.effect", {"id": effect})
    drive(run)
    _worker_dies(run)
    api = harness_team.api("operator")
    status, body = api.post(f"/runs/{run.pk}/tasks/r1/retry", {})
    assert status == 409 and body["error"]["key"] == "nonreplayable_calls_made", body
    assert body["error"]["calls"] == [{"key": "r1.1", "tool": "test.effect", "status": "completed"}]
    assert "r1.1 (test.effect, completed)" in body["error"]["detail"]
    assert Task.objects.get(run=run, key="r1").status == "uncertain"  # nothing changed
    status, body = api.post(f"/runs/{run.pk}/tasks/r1/retry", {"confirm_calls": ["r1.2"]})
    assert status == 409 and body["error"]["key"] == "nonreplayable_calls_made"
    status, body = api.post(f"/runs/{run.pk}/tasks/r1/retry", {"confirm_calls": ["r1.1"]})
    assert status == 200, body
    r1 = Task.objects.get(run=run, key="r1")
    assert r1.status == "waiting" and r1.ready
    verb = TraceEvent.objects.filter(run=run, task_key="r1", event="verb").latest("seq")
    assert verb.data == {"verb": "retry", "confirmed_calls": ["r1.1"], **({"by": verb.data["by"]} if "by" in verb.data else {})}


@pytest.mark.spec("F7", "S10", "S14")
def test_the_consoles_retry_button_lists_the_calls_and_confirms_them(harness_team: Team, no_dispatch: list[int]) -> None:
    from django.test import Client

    run, claimed = _claimed_session(harness_team, "nr-console")
    _call(claimed, "test.effect", {"id": uuid.uuid4().hex})
    drive(run)
    _worker_dies(run)
    client = Client()
    client.force_login(harness_team.users["operator"])
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'data-nonreplayable="r1"' in page and '<code class="key">r1.1</code> test.effect' in page
    assert '<input type="hidden" name="confirm_calls" value="r1.1">' in page
    # A retry that does not confirm them (another page, an old one) is refused, the calls named.
    refused = client.post(f"/runs/{run.pk}/tasks/r1/retry/", HTTP_HX_REQUEST="true").content.decode()
    assert "Confirm the calls it already made" in refused and "r1.1 (test.effect, completed)" in refused
    assert Task.objects.get(run=run, key="r1").status == "uncertain"
    client.post(f"/runs/{run.pk}/tasks/r1/retry/", {"confirm_calls": ["r1.1"]}, HTTP_HX_REQUEST="true")
    assert Task.objects.get(run=run, key="r1").status == "waiting"
