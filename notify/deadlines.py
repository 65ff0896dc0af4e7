"""Waiting work has deadlines: beat's sweep reminds a wait's owners once it has waited the
workspace's reminder time, and tells the next role or group once it has waited its escalation
time (tenancy/approvers.py says whose a wait is and what the times are).

Each stage of each wait is told once. The sweep writes one `WaitNotice` row per (wait, stage),
unique on the wait's run, task and start, and in the same transaction the audit trail's entry (a
`remind` or `escalate` verb by `oz0` in the run's trace, `kernel.note_wait`, which writes it only
while the wait is still the one seen); the delivery is sent after commit. Two sweeps at once, or a
sweep again after a retry, meet the row and send nothing. A delivery that fails is retried by Celery
and sends only to the subscriptions it has not reached.

Who hears: the recipients' subscriptions in the workspace that ask for the wait's own kind, or for
`deadline` (the existing e-mail and webhook channels; an agent filter applies). A reminder carries
no words of the run: kind, tool, agent, task, how long it waited and whose it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import DateTimeField, DurationField, Exists, ExpressionWrapper, F, Func, OuterRef, Q, QuerySet, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from notify.delivery import DeliveryError, post_webhook, send_email
from notify.digests import age_text, chat_literal, slack_escaped
from notify.models import Subscription, WaitNotice
from runs import kernel
from runs.models import Run, RunStatus, Task, TaskStatus
from tenancy.approvers import (
    OPERATORS,
    OPERATORS_OWN,
    Owners,
    default_escalation_seconds,
    default_reminder_seconds,
    groups_of,
    owners_of,
)
from tenancy.models import ApproverGroup, Membership, Role, Workspace

STAGES = {"reminder": ("reminder_seconds", "remind"), "escalation": ("escalation_seconds", "escalate")}
SWEEP_BATCH = 200
# People named in one audit entry; the rest are counted.
NAMED_MAX = 50

Send = Callable[[int], object]


@dataclass(frozen=True)
class DueWait:
    kind: str
    stage: str
    run: Run
    task_key: str | None
    tool: str | None
    since: datetime


class _Gone(Exception):
    """The wait ended between the sweep's read and its lock: nothing is told."""


def _limit(prefix: str, stage: str) -> Any:
    """The workspace's seconds for `stage` (its own, else the install's), as an expression."""
    field, _ = STAGES[stage]
    default = default_reminder_seconds() if stage == "reminder" else default_escalation_seconds()
    return Coalesce(F(f"{prefix}workspace__{field}"), Value(default))


def _due_at(start: str, prefix: str, stage: str) -> Any:
    interval = Func(_limit(prefix, stage), template="make_interval(secs => %(expressions)s)", output_field=DurationField())
    return ExpressionWrapper(F(start) + interval, output_field=DateTimeField())


def _task_waits(kind: str, stage: str, now: datetime) -> QuerySet[Task]:
    status = TaskStatus.NEEDS_APPROVAL if kind == "approval" else TaskStatus.AWAITING_INPUT
    told = WaitNotice.objects.filter(
        run_id=OuterRef("run_id"), task_key=OuterRef("key"), stage=stage, since=OuterRef("queued_at")
    )
    tasks = Task.objects.filter(status=status, composed=True, queued_at__isnull=False)
    if kind == "question":
        tasks = tasks.filter(resolution_token__isnull=True)
    return (
        tasks.alias(limit=_limit("run__", stage), due_at=_due_at("queued_at", "run__", stage))
        .filter(limit__gt=0, due_at__lte=now)
        .filter(~Exists(told))
        .select_related("run", "run__workspace")
        .order_by("queued_at", "pk")
    )


def _held_runs(stage: str, now: datetime) -> QuerySet[Run]:
    told = WaitNotice.objects.filter(run_id=OuterRef("pk"), task_key="", stage=stage, since=OuterRef("held_since"))
    return (
        Run.objects.filter(status=RunStatus.NEEDS_ATTENTION, held_since__isnull=False)
        .alias(limit=_limit("", stage), due_at=_due_at("held_since", "", stage))
        .filter(limit__gt=0, due_at__lte=now)
        .filter(~Exists(told))
        .select_related("workspace")
        .order_by("held_since", "id")
    )


def due_waits(now: datetime, *, workspace_ids: Sequence[int] | None = None, batch: int = SWEEP_BATCH) -> list[DueWait]:
    """Every stage of every wait that is due now and was not told yet (at most `batch` per kind and
    stage), in every workspace or in those named."""
    due: list[DueWait] = []
    every_workspace = list(workspace_ids if workspace_ids is not None else Workspace.objects.values_list("pk", flat=True))
    for stage in STAGES:
        for kind in ("approval", "question"):
            tasks = _task_waits(kind, stage, now)
            if workspace_ids is not None:
                tasks = tasks.filter(run__workspace_id__in=workspace_ids)
            for task in tasks[:batch]:
                assert task.queued_at is not None
                due.append(DueWait(kind, stage, task.run, task.key, task.spec.get("tool"), task.queued_at))
        # Held runs by workspace: the runs' (workspace, status) index, not a scan of every run.
        held = _held_runs(stage, now).filter(workspace_id__in=every_workspace)
        for run in held[:batch]:
            assert run.held_since is not None
            blocked = (run.attention or {}).get("blocked_task_keys") or [None]
            due.append(DueWait("hold", stage, run, blocked[0], None, run.held_since))
    return due


class Book:
    """What one sweep reads once per workspace: its groups and its operators."""

    def __init__(self) -> None:
        self.groups: dict[int, list[ApproverGroup]] = {}
        self.operators: dict[int, list[str]] = {}

    def groups_of(self, workspace_id: int) -> list[ApproverGroup]:
        if workspace_id not in self.groups:
            self.groups[workspace_id] = groups_of(workspace_id)
        return self.groups[workspace_id]

    def operators_of(self, workspace_id: int) -> list[str]:
        if workspace_id not in self.operators:
            self.operators[workspace_id] = sorted(
                Membership.objects.filter(workspace_id=workspace_id, role=Role.OPERATOR, user__is_active=True).values_list(
                    "user__username", flat=True
                )
            )
        return self.operators[workspace_id]

    def owners(self, wait: DueWait) -> Owners:
        if wait.kind != "approval":
            return OPERATORS_OWN
        return owners_of(self.groups_of(wait.run.workspace_id), wait.tool)

    def people(self, workspace: Workspace, names: Iterable[str]) -> list[str]:
        """Usernames of the groups and roles named (OPERATORS for the operators), members only."""
        by_name = {g.name: g for g in self.groups_of(workspace.pk)}
        people: set[str] = set()
        for name in names:
            if name == OPERATORS:
                people.update(self.operators_of(workspace.pk))
            elif name in by_name:
                people.update(m.get_username() for m in by_name[name].members.all())
        members = set(
            Membership.objects.filter(workspace=workspace, user__username__in=people, user__is_active=True).values_list(
                "user__username", flat=True
            )
        )
        return sorted(members)

    def targets(self, wait: DueWait, owners: Owners) -> list[str]:
        """Whom a stage tells: the owners (a reminder), the next role or group (an escalation)."""
        if wait.stage == "reminder":
            return list(owners.groups) or [OPERATORS]
        if owners.by_group:
            return list(owners.escalate_to)
        workspace = wait.run.workspace
        escalate_to = next((g for g in self.groups_of(workspace.pk) if g.pk == workspace.escalate_to_id), None)
        return [escalate_to.name] if escalate_to is not None else [OPERATORS]


def _label(names: Iterable[str]) -> list[str]:
    return [OPERATORS if name == OPERATORS else f"group {name}" for name in names]


def tell(wait: DueWait, now: datetime, send: Send, book: Book) -> int | None:
    """Record one stage of one wait and its audit entry, and send its delivery after commit; None
    when another sweep told it already or the wait ended meanwhile."""
    owners = book.owners(wait)
    targets = book.targets(wait, owners)
    recipients = book.people(wait.run.workspace, targets)
    _, verb = STAGES[wait.stage]
    data: dict[str, Any] = {
        "verb": verb,
        "kind": wait.kind,
        "waited_seconds": max(0, int((now - wait.since).total_seconds())),
        "owners": _label(owners.groups) if owners.by_group else [OPERATORS],
        "to": _label(targets),
        "people": recipients[:NAMED_MAX],
        "notified": len(recipients),
    }
    try:
        with transaction.atomic():
            try:
                with transaction.atomic():
                    notice = WaitNotice.objects.create(
                        workspace_id=wait.run.workspace_id,
                        run_id=wait.run.pk,
                        task_key=wait.task_key or "" if wait.kind != "hold" else "",
                        kind=wait.kind,
                        stage=wait.stage,
                        since=wait.since,
                        created_at=now,
                        owners=data["owners"],
                        targets=data["to"],
                        recipients=recipients,
                    )
            except IntegrityError:
                return None  # told already, by this sweep's twin or an earlier pass
            if not kernel.note_wait(run_id=wait.run.pk, kind=wait.kind, key=wait.task_key, since=wait.since, data=data):
                raise _Gone
            notice_id = notice.pk
            transaction.on_commit(lambda: send(notice_id))
    except _Gone:
        return None
    return notice_id


def sweep(
    send: Send, now: datetime | None = None, *, workspace_ids: Sequence[int] | None = None, batch: int = SWEEP_BATCH
) -> list[int]:
    """Tell the due stages of waits once (in every workspace, or those named); the notices written.
    A pass tells at most `batch` per kind and stage, the oldest first; what it told is no longer
    due, so a larger backlog is told over the next passes, in order of age."""
    now = now or timezone.now()
    book = Book()
    told = []
    for wait in due_waits(now, workspace_ids=workspace_ids, batch=batch):
        notice = tell(wait, now, send, book)
        if notice is not None:
            told.append(notice)
    return told


# ---- delivery ----


def compose(notice: WaitNotice, *, chat: bool = False) -> tuple[str, str]:
    """(subject, text): what waits, how long, whose it is; never the run's words. In a chat text
    every value from a run (agent, task, tool) is inert (digests.chat_literal)."""
    base = settings.OZ0_PUBLIC_URL.rstrip("/")
    run = notice.run
    workspace = notice.workspace.slug
    literal = chat_literal if chat else str
    kind = notice.kind.replace("_", " ")
    # How long it had waited when its stage came (a retried delivery says the same).
    waited = age_text(notice.created_at, notice.since)
    owners = ", ".join(notice.owners)
    if notice.stage == "reminder":
        subject = f"oz0: reminder: {kind} waiting {waited} on {owners} in {workspace}"
    else:
        subject = f"oz0: escalation: {kind} of {owners} overdue ({waited}) in {workspace}"
    lines = [slack_escaped(subject) if chat else subject, ""]
    agent = f" · agent {literal(run.agent_name)}" if run.agent_name else ""
    task = f" · task {literal(notice.task_key)}" if notice.task_key else ""
    tool = ""
    if notice.kind == "approval":
        call = Task.objects.filter(run=run, key=notice.task_key).values_list("spec__tool", flat=True).first()
        tool = f" · tool {literal(str(call))}" if call else ""
    lines.append(f"- {kind}{agent}{task}{tool} · waiting {waited} · {base}/runs/{run.pk}/")
    lines.append(f"  whose: {', '.join(notice.owners)}; told: {', '.join(notice.targets)}")
    lines += ["", f"Inbox: {base}/w/{workspace}/inbox/", f"Your subscriptions: {base}/subscriptions/"]
    return subject, "\n".join(lines)


def subscriptions_for(notice: WaitNotice) -> QuerySet[Subscription]:
    """The recipients' subscriptions in the workspace that hear of this notice, not reached yet;
    membership re-read now: someone removed since the sweep hears nothing."""
    members = Membership.objects.filter(workspace_id=notice.workspace_id).values("user_id")
    people = get_user_model().objects.filter(username__in=notice.recipients, is_active=True, pk__in=members)
    return (
        Subscription.objects.filter(workspace_id=notice.workspace_id, user__in=people, kinds__overlap=[notice.kind, "deadline"])
        .filter(Q(agent="") | Q(agent=notice.run.agent_name))
        .exclude(pk__in=notice.delivered_to)
        .select_related("user")
        .order_by("pk")
    )


def deliver(notice_id: int, now: datetime | None = None) -> str:
    """Send one notice to each subscription that hears of it: 'sent', 'nothing' (no subscription
    asked for it), or DeliveryError raised (for Celery to retry) after the others were reached."""
    now = now or timezone.now()
    notice = WaitNotice.objects.filter(pk=notice_id).select_related("run", "workspace").first()
    if notice is None:
        return "nothing"
    reached: list[int] = []
    failed: list[str] = []
    for sub in subscriptions_for(notice):
        try:
            if sub.email:
                subject, text = compose(notice)
                send_email(sub.user.email, subject, text)
            if sub.webhook_url:
                post_webhook(sub.webhook_url, sub.secret, compose(notice, chat=True)[1])
        except DeliveryError as error:
            failed.append(str(error))
            continue
        reached.append(sub.pk)
    delivered = [*notice.delivered_to, *reached]
    WaitNotice.objects.filter(pk=notice.pk).update(
        delivered_to=delivered, delivered_at=None if failed else now, last_error=(failed[0] if failed else "")[:500]
    )
    if failed:
        raise DeliveryError(failed[0])
    return "sent" if reached else "nothing"
