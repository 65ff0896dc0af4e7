"""Races over waiting work's owners and deadlines (issue 31 item 4), each contender in its own
thread with its own connection, on committed data: two approvals of one call, two sweeps at once."""

from __future__ import annotations

from datetime import timedelta

import pytest

from notify import deadlines
from notify.models import WaitNotice
from runs import kernel
from runs.kernel import KernelError
from tenancy.models import ApproverGroup, Workspace
from tests.conftest import Team
from tests.console.states import approval_run
from tests.factories import make_member
from tests.notify.test_deadlines import ESCALATE, REMIND, entries, since_of
from tests.runs.test_approver_groups import group, pending, status_of, verbs
from tests.runs.test_concurrency import race

pytestmark = pytest.mark.usefixtures("committed", "no_dispatch")


@pytest.mark.spec("S5", "S6")
def test_two_approvals_at_once_are_decided_once_each() -> None:
    team = Team()
    first, second = (make_member(workspace=team.workspace, role="operator") for _ in range(2))
    group(team.workspace, "finance", ["test.effect*"], first, second, two=True)
    # Two different approvers at once: one is the first, the other the second; the call runs.
    run = pending(team)
    outcomes = race(
        lambda: kernel.approve(run_id=run.pk, key="r1.1", user=first),
        lambda: kernel.approve(run_id=run.pk, key="r1.1", user=second),
    )
    assert not any(isinstance(o, KernelError) for o in outcomes), outcomes
    assert status_of(run) != "needs_approval"
    assert sorted(v.get("approval") for v in verbs(run) if v["verb"] == "approve") == [1, 2]
    # The same approver twice at once: one first approval, one same_approver; the call still waits.
    run = pending(team)
    outcomes = race(*[lambda: kernel.approve(run_id=run.pk, key="r1.1", user=first) for _ in range(2)])
    assert sorted(o.key for o in outcomes if isinstance(o, KernelError)) == ["same_approver"]
    assert status_of(run) == "needs_approval"
    # One approver group, no second needed: two members at once decide it once.
    ApproverGroup.objects.filter(workspace=team.workspace).update(two_approvers=False)
    run = pending(team)
    outcomes = race(
        lambda: kernel.approve(run_id=run.pk, key="r1.1", user=first),
        lambda: kernel.approve(run_id=run.pk, key="r1.1", user=second),
    )
    assert sorted(o.key for o in outcomes if isinstance(o, KernelError)) == ["not_pending"]


def test_two_sweeps_at_once_tell_each_stage_once() -> None:
    team = Team()
    Workspace.objects.filter(pk=team.workspace.pk).update(reminder_seconds=REMIND, escalation_seconds=ESCALATE)
    runs = [approval_run(team.workspace, team.users["operator"]) for _ in range(3)]
    at = max(since_of(run) for run in runs) + timedelta(seconds=ESCALATE)
    ids = [team.workspace.pk]
    outcomes = race(*[lambda: deadlines.sweep(send=lambda pk: None, now=at, workspace_ids=ids) for _ in range(3)])
    told = [pk for outcome in outcomes for pk in outcome]
    assert len(told) == len(set(told)) == 6
    for run in runs:
        assert sorted(WaitNotice.objects.filter(run=run).values_list("stage", flat=True)) == ["escalation", "reminder"]
        assert len(entries(run, "remind")) == len(entries(run, "escalate")) == 1
