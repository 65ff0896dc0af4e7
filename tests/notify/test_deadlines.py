"""Waiting work's deadlines (issue 31 item 4): a pending approval, question or hold older than its
workspace's reminder time reminds its owners, past its escalation time tells the next role or
group; each stage once (two sweeps, a retry), each in the audit trail, through the subscriptions'
channels, never with the run's words; a wait is never ended by it (S6, S19)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.conf import settings

from notify import deadlines, subscriptions
from notify.models import WaitNotice
from runs import kernel
from runs.models import Run, Task, TraceEvent
from tenancy.models import ApproverGroup, Workspace
from tests.conftest import Team
from tests.console.states import approval_run, halted_run, question_run
from tests.factories import make_member
from tests.notify.conftest import WebhookReceiver

pytestmark = pytest.mark.django_db

REMIND, ESCALATE = 600, 1800


@pytest.fixture
def office(team: Team) -> dict[str, Any]:
    """Deadlines of 10 and 30 minutes; finance owns test.effect* and escalates to leads."""
    Workspace.objects.filter(pk=team.workspace.pk).update(reminder_seconds=REMIND, escalation_seconds=ESCALATE)
    people = {name: make_member(workspace=team.workspace, role="operator") for name in ("payer", "lead")}
    leads = ApproverGroup.objects.create(workspace=team.workspace, name="leads", tools=["leads.only"])
    leads.members.set([people["lead"]])
    finance = ApproverGroup.objects.create(workspace=team.workspace, name="finance", tools=["test.effect*"], escalate_to=leads)
    finance.members.set([people["payer"]])
    return people


def sweep(at: datetime, capture: Any, workspace: Workspace) -> list[int]:
    """Beat's sweep, over the test's own workspace (committed tests elsewhere leave waits behind)."""
    sent: list[int] = []
    with capture(execute=True):
        told = deadlines.sweep(send=sent.append, now=at, workspace_ids=[workspace.pk])
    assert sent == told  # each delivery is sent once the notice committed
    return told


def entries(run: Run, verb: str) -> list[TraceEvent]:
    return list(TraceEvent.objects.filter(run=run, event="verb", data__verb=verb).order_by("seq"))


def since_of(run: Run, key: str = "r1.1") -> datetime:
    at = Task.objects.get(run=run, key=key).queued_at
    assert at is not None
    return at


@pytest.mark.spec("S6")
def test_an_approval_is_reminded_once_at_its_reminder_time_and_escalated_once_at_its_escalation_time(
    team: Team, office: dict[str, Any], django_capture_on_commit_callbacks: Any
) -> None:
    run = approval_run(team.workspace, team.users["operator"], tool="test.effect", args={"amount": 5})
    since = since_of(run)
    assert sweep(since + timedelta(seconds=REMIND - 1), django_capture_on_commit_callbacks, team.workspace) == []
    [reminder] = sweep(since + timedelta(seconds=REMIND), django_capture_on_commit_callbacks, team.workspace)
    assert sweep(since + timedelta(seconds=REMIND), django_capture_on_commit_callbacks, team.workspace) == []  # a second beat
    assert sweep(since + timedelta(seconds=ESCALATE - 1), django_capture_on_commit_callbacks, team.workspace) == []
    [escalation] = sweep(since + timedelta(seconds=ESCALATE), django_capture_on_commit_callbacks, team.workspace)
    assert sweep(since + timedelta(days=2), django_capture_on_commit_callbacks, team.workspace) == []
    told = {n.stage: n for n in WaitNotice.objects.filter(run=run)}
    assert (told["reminder"].pk, told["escalation"].pk) == (reminder, escalation)
    assert told["reminder"].recipients == [office["payer"].username] and told["reminder"].owners == ["group finance"]
    assert told["escalation"].recipients == [office["lead"].username] and told["escalation"].targets == ["group leads"]
    [remind] = entries(run, "remind")
    [escalate] = entries(run, "escalate")
    assert remind.actor == escalate.actor == "oz0"
    assert remind.data["to"] == ["group finance"] and remind.data["waited_seconds"] == REMIND
    assert escalate.data["to"] == ["group leads"] and escalate.data["people"] == [office["lead"].username]
    assert Task.objects.get(run=run, key="r1.1").status == "needs_approval"  # told, never decided (S6)
    trail = team.api("viewer").get(f"/workspaces/{team.slug}/audit")[1]["items"]
    assert [e["verb"] for e in trail] == ["escalate", "remind", "assign"]
    assert trail[1]["note"] == "approval waiting 10 min, owned by group finance: reminded group finance (1 person)"


@pytest.mark.spec("S19")
def test_questions_and_holds_are_the_operators_and_escalate_to_the_workspaces_group(
    team: Team, office: dict[str, Any], django_capture_on_commit_callbacks: Any
) -> None:
    Workspace.objects.filter(pk=team.workspace.pk).update(
        escalate_to=ApproverGroup.objects.get(workspace=team.workspace, name="leads")
    )
    question = question_run(team.workspace, team.users["operator"])
    held = halted_run(team.workspace, team.users["operator"])
    assert held.held_since is not None
    start = min(since_of(question, "r1.1"), held.held_since)
    sweep(start + timedelta(seconds=ESCALATE + 5), django_capture_on_commit_callbacks, team.workspace)
    operators = sorted([team.users["operator"].username, office["payer"].username, office["lead"].username])
    for run, kind in ((question, "question"), (held, "hold")):
        told = {n.stage: n for n in WaitNotice.objects.filter(run=run)}
        assert told["reminder"].kind == kind and told["reminder"].owners == ["operators"]
        assert told["reminder"].recipients == operators
        assert told["escalation"].targets == ["group leads"] and told["escalation"].recipients == [office["lead"].username]
    held.refresh_from_db()
    assert held.status == "needs_attention"  # a hold has no clock: telling people ends nothing (S19)
    [remind] = entries(held, "remind")
    assert remind.task_key == "a" and remind.data["kind"] == "hold"


def test_a_run_held_again_is_a_new_wait_with_its_own_reminder(team: Team, django_capture_on_commit_callbacks: Any) -> None:
    Workspace.objects.filter(pk=team.workspace.pk).update(reminder_seconds=REMIND, escalation_seconds=0)
    held = halted_run(team.workspace, team.users["operator"])
    assert held.held_since is not None
    [first] = sweep(held.held_since + timedelta(seconds=REMIND), django_capture_on_commit_callbacks, team.workspace)
    kernel.retry(run_id=held.pk, key="a", user=team.users["operator"])
    claimed = kernel.claim_task(None, Task.objects.get(run=held, key="a").pk, "test-claim-2")
    assert claimed is not None and kernel.task_fail(claimed, "tool_failed", "again")
    held.refresh_from_db()
    assert held.status == "needs_attention" and held.held_since is not None
    [second] = sweep(held.held_since + timedelta(seconds=REMIND), django_capture_on_commit_callbacks, team.workspace)
    assert first != second and len(entries(held, "remind")) == 2
    assert sweep(held.held_since + timedelta(days=1), django_capture_on_commit_callbacks, team.workspace) == []


def test_zero_turns_a_stage_off_and_the_install_default_applies_when_unset(
    team: Team, django_capture_on_commit_callbacks: Any
) -> None:
    Workspace.objects.filter(pk=team.workspace.pk).update(reminder_seconds=0, escalation_seconds=None)
    run = approval_run(team.workspace, team.users["operator"])
    since = since_of(run)
    assert (
        sweep(
            since + timedelta(seconds=settings.OZ0_WAIT_ESCALATION_SECONDS - 1),
            django_capture_on_commit_callbacks,
            team.workspace,
        )
        == []
    )
    sweep(since + timedelta(seconds=settings.OZ0_WAIT_ESCALATION_SECONDS), django_capture_on_commit_callbacks, team.workspace)
    assert list(WaitNotice.objects.filter(run=run).values_list("stage", flat=True)) == ["escalation"]
    assert WaitNotice.objects.get(run=run).targets == ["operators"]


def test_a_wait_decided_between_the_read_and_the_lock_is_not_told(
    team: Team, office: dict[str, Any], django_capture_on_commit_callbacks: Any
) -> None:
    run = approval_run(team.workspace, team.users["operator"], tool="test.effect")
    at = since_of(run) + timedelta(seconds=REMIND)
    [due] = deadlines.due_waits(at, workspace_ids=[team.workspace.pk])
    kernel.approve(run_id=run.pk, key="r1.1", user=office["payer"])
    sent: list[int] = []
    with django_capture_on_commit_callbacks(execute=True):
        assert deadlines.tell(due, at, sent.append, deadlines.Book()) is None
    assert sent == [] and not WaitNotice.objects.filter(run=run).exists() and not entries(run, "remind")


def test_a_retry_of_a_stage_already_told_sends_nothing(
    team: Team, office: dict[str, Any], django_capture_on_commit_callbacks: Any
) -> None:
    run = approval_run(team.workspace, team.users["operator"], tool="test.effect")
    at = since_of(run) + timedelta(seconds=REMIND)
    [due] = deadlines.due_waits(at, workspace_ids=[team.workspace.pk])
    sent: list[int] = []
    with django_capture_on_commit_callbacks(execute=True):
        first = deadlines.tell(due, at, sent.append, deadlines.Book())
        again = deadlines.tell(due, at, sent.append, deadlines.Book())
    assert first is not None and again is None and sent == [first]
    assert len(entries(run, "remind")) == 1


def test_a_notice_reaches_the_owners_subscriptions_without_the_runs_words(
    team: Team, office: dict[str, Any], webhook: WebhookReceiver, django_capture_on_commit_callbacks: Any
) -> None:
    payer, lead = office["payer"], office["lead"]
    subscriptions.create(payer, {"workspace": team.slug, "kinds": ["deadline"], "webhook_url": webhook.url + "/payer"})
    subscriptions.create(lead, {"workspace": team.slug, "kinds": ["question"], "webhook_url": webhook.url + "/lead"})
    run = approval_run(team.workspace, team.users["operator"], tool="test.effect", args={"iban": "SECRET-IBAN"})
    [notice] = sweep(since_of(run) + timedelta(seconds=REMIND), django_capture_on_commit_callbacks, team.workspace)
    assert deadlines.deliver(notice) == "sent"
    [text] = webhook.texts()
    assert "reminder" in text and "group finance" in text and "`test.effect`" in text and "10 min" in text
    assert "SECRET-IBAN" not in text
    assert deadlines.deliver(notice) == "nothing"  # a redelivered message: the subscription was reached
    assert len(webhook.posts) == 1
    [escalation] = sweep(since_of(run) + timedelta(seconds=ESCALATE), django_capture_on_commit_callbacks, team.workspace)
    # The lead subscribed to questions only: an approval's escalation is not theirs to hear.
    assert deadlines.deliver(escalation) == "nothing" and len(webhook.posts) == 1


def test_a_failed_delivery_is_retried_to_the_unreached_subscriptions_only(
    team: Team, office: dict[str, Any], webhook: WebhookReceiver, django_capture_on_commit_callbacks: Any
) -> None:
    payer = office["payer"]
    subscriptions.create(payer, {"workspace": team.slug, "kinds": ["approval"], "webhook_url": webhook.url + "/a"})
    subscriptions.create(payer, {"workspace": team.slug, "kinds": ["deadline"], "webhook_url": webhook.url + "/b"})
    run = approval_run(team.workspace, team.users["operator"], tool="test.effect")
    [notice] = sweep(since_of(run) + timedelta(seconds=REMIND), django_capture_on_commit_callbacks, team.workspace)
    webhook.answers = [200, 500]
    with pytest.raises(deadlines.DeliveryError):
        deadlines.deliver(notice)
    assert deadlines.deliver(notice) == "sent"
    assert sorted(webhook.paths) == ["/hooks/T0/B0/abc/a", "/hooks/T0/B0/abc/b", "/hooks/T0/B0/abc/b"]
    assert WaitNotice.objects.get(pk=notice).delivered_at is not None


def test_someone_no_longer_a_member_hears_nothing(
    team: Team, office: dict[str, Any], webhook: WebhookReceiver, django_capture_on_commit_callbacks: Any
) -> None:
    payer = office["payer"]
    subscriptions.create(payer, {"workspace": team.slug, "kinds": ["deadline"], "webhook_url": webhook.url})
    run = approval_run(team.workspace, team.users["operator"], tool="test.effect")
    [notice] = sweep(since_of(run) + timedelta(seconds=REMIND), django_capture_on_commit_callbacks, team.workspace)
    payer.memberships.all().delete()
    assert deadlines.deliver(notice) == "nothing" and webhook.posts == []


def test_beat_sweeps_the_deadlines_on_its_own_schedule() -> None:
    from notify import tasks

    entry = settings.CELERY_BEAT_SCHEDULE["deadlines-sweep"]
    assert entry["task"] == tasks.sweep_deadlines.name == "notify.tasks.sweep_deadlines"
    assert entry["schedule"] == settings.OZ0_DEADLINE_SWEEP_SECONDS
    assert tasks.deliver_notice.name == "notify.tasks.deliver_notice"


def test_a_backlog_larger_than_a_pass_is_told_over_the_next_passes_oldest_first(
    team: Team, django_capture_on_commit_callbacks: Any
) -> None:
    Workspace.objects.filter(pk=team.workspace.pk).update(reminder_seconds=REMIND, escalation_seconds=0)
    runs = [approval_run(team.workspace, team.users["operator"]) for _ in range(5)]
    start = since_of(runs[0])
    # Queued a minute apart, the last run the oldest: age, not creation, orders the passes.
    for age, run in enumerate(reversed(runs)):
        Task.objects.filter(run=run, key="r1.1").update(queued_at=start - timedelta(minutes=5 - age))
    at = start + timedelta(seconds=REMIND)
    told: list[list[Any]] = []
    for _ in range(4):
        sent: list[int] = []
        with django_capture_on_commit_callbacks(execute=True):
            notices = deadlines.sweep(send=sent.append, now=at, workspace_ids=[team.workspace.pk], batch=2)
        told.append([WaitNotice.objects.get(pk=pk).run_id for pk in notices])
    assert told == [[runs[4].pk, runs[3].pk], [runs[2].pk, runs[1].pk], [runs[0].pk], []]
