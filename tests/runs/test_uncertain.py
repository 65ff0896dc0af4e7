"""`uncertain` holds for a person whatever the task's policy (S10): a model-composed call (absorb by
default) whose worker died with no result may have had its effect, so the round waits."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from runs import kernel
from runs.kernel import Conflict, sweep_expired_claims
from runs.models import Run
from runs.selectors import candidates
from tests.conftest import Team
from tests.runs.driver import drive, step, task
from testtools.models import EffectRecord


def round_with_effect(team: Team, effect_id: str, **round_: Any) -> Run:
    script = [{"tool_calls": [{"tool": "test.effect", "args": {"id": effect_id}}]}, {"text": "done"}]
    spec = {"key": "r1", "kind": "round", "model": "script", "prompt": "pay", "script": script, **round_}
    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={"tasks": [spec], "deliverable": "r1", "approval": {"mode": "bypass"}},
    )
    # The round runs and authors its call; the call's worker claims it and dies before it reports.
    assert step(run, task(run, "r1"))
    call = task(run, "r1.1")
    assert call.on_failure == "absorb" and call.composed
    assert kernel.claim_task(None, call.pk, "worker-that-dies") is not None
    sweep_expired_claims(timezone.now() + timedelta(seconds=settings.OZ0_LEASE_SECONDS + 1))
    run.refresh_from_db()
    return run


@pytest.mark.spec("S10", "S15")
def test_it_holds_an_uncertain_model_composed_call_for_a_person(team: Team) -> None:
    run = round_with_effect(team, uuid.uuid4().hex)
    call = task(run, "r1.1")
    assert (call.status, call.error_key, call.failure_resolution) == ("uncertain", "tool_uncertain", None)
    # The round waits: nothing ran it again with the call read as failed.
    r1 = task(run, "r1")
    assert (r1.status, r1.ready) == ("waiting", False)
    run = drive(run)
    assert task(run, "r1").status == "waiting"
    assert run.status == "needs_attention"
    assert run.attention["reason"] == "halt_failure" and run.attention["blocked_task_keys"] == ["r1.1"]
    assert candidates(run) == ["r1.1"]


@pytest.mark.spec("S10", "S14")
def test_it_runs_an_uncertain_call_again_only_on_a_persons_retry(team: Team) -> None:
    effect = uuid.uuid4().hex
    run = round_with_effect(team, effect)
    assert EffectRecord.objects.filter(effect_id=effect).count() == 0
    kernel.retry(run_id=run.pk, key="r1.1", user=team.users["operator"])
    run = drive(run)
    assert EffectRecord.objects.filter(effect_id=effect).count() == 1
    assert run.status == "completed" and run.output == "done"


@pytest.mark.spec("S10", "S14")
def test_it_lets_an_absorbed_call_abandoned_by_a_person_reach_the_model_as_failed(team: Team) -> None:
    effect = uuid.uuid4().hex
    run = round_with_effect(team, effect)
    kernel.abandon(run_id=run.pk, key="r1.1", user=team.users["operator"])
    run = drive(run)
    assert run.status == "completed" and run.output == "done"
    assert EffectRecord.objects.filter(effect_id=effect).count() == 0
    history = task(run, "r1").state["history"]
    told = [m for m in history if m.get("role") == "tool"]
    assert len(told) == 1 and told[0]["ok"] is False and "tool_uncertain" in told[0]["content"]
    with pytest.raises(Conflict):
        kernel.retry(run_id=run.pk, key="r1.1", user=team.users["operator"])


@pytest.mark.spec("S10")
def test_it_skips_the_dependents_of_an_abandoned_uncertain_call_that_propagates(team: Team) -> None:
    effect = uuid.uuid4().hex
    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={
            "tasks": [
                {"key": "pay", "kind": "tool", "tool": "test.effect", "args": {"id": effect}},
                {"key": "after", "kind": "tool", "tool": "test.echo", "args": {"value": 1}, "after": ["pay"]},
            ],
            "deliverable": "after",
        },
    )
    assert kernel.claim_task(None, task(run, "pay").pk, "worker-that-dies") is not None
    sweep_expired_claims(timezone.now() + timedelta(seconds=settings.OZ0_LEASE_SECONDS + 1))
    run.refresh_from_db()
    assert run.status == "needs_attention" and run.attention["blocked_task_keys"] == ["pay"]
    kernel.abandon(run_id=run.pk, key="pay", user=team.users["operator"])
    run = drive(run)
    assert task(run, "after").status == "skipped"
    assert run.attention["reason"] == "deliverable_unresolved"
