"""Digests: the beat sweep finds subscriptions with news, and one delivery per subscription per
interval tells its owner what waits on them.

A wait is news to a subscription when it began after the subscription's watermark: an approval
when its call parked (its park deadline less the park length, as the inbox reckons it), a
question when the model's await started, a hold when the run was held. Keyed client awaits are
`dispatched` to their token holder, never `awaiting_input`, and are never told (S9). The digest
covers waits up to a few seconds ago (SETTLE), so a wait stamped by a transaction that commits
after the digest read is still news to the next one.

The message carries each wait's kind, run link and age (in a webhook's chat text, every value from
a run made inert: Slack's escape and a code span, see chat_literal); words (the question, the args, the
failure's message) only when the subscriber may read the run's content (F11, F12). Membership
is re-read at send time: a removed member gets nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from notify.delivery import DeliveryError, post_webhook, send_email
from notify.models import Subscription
from oz0agents.models import RolloutEvent
from oz0agents.rollouts import AUTO_ROLLED_BACK
from runs.models import Run, RunStatus, Task, TaskStatus
from runs.permissions import can_read_content
from tenancy.permissions import role_of

SETTLE = timedelta(seconds=2)
# Waits listed in one message; the rest are counted and the inbox linked.
LISTED_MAX = 20
# A subscription handed to a delivery that never settled (its retries spent, its worker lost)
# is handed out again after this long.
REQUEUE = timedelta(minutes=30)
SWEEP_BATCH = 500


@dataclass(frozen=True)
class Wait:
    kind: str
    run: Run
    task: str | None
    since: datetime
    words: str
    # Where the digest links instead of the run (a rollback: the agent's page).
    link: str | None = None


def _park() -> timedelta:
    return timedelta(seconds=float(settings.OZ0_APPROVAL_PARK_SECONDS))


def _news(sub: Subscription, *, after: datetime, until: datetime) -> dict[str, QuerySet[Any]]:
    """Per kind the subscription wants, the waits that began in (after, until], in wait order."""
    park = _park()
    tasks = Task.objects.filter(composed=True, run__workspace_id=sub.workspace_id).select_related("run")
    holds = Run.objects.filter(workspace_id=sub.workspace_id, status=RunStatus.NEEDS_ATTENTION)
    rollbacks = RolloutEvent.objects.filter(workspace_id=sub.workspace_id, verb=AUTO_ROLLED_BACK).select_related("workspace")
    if sub.agent:
        tasks = tasks.filter(run__agent_name=sub.agent)
        holds = holds.filter(agent_name=sub.agent)
        rollbacks = rollbacks.filter(agent_name=sub.agent)
    news: dict[str, QuerySet[Any]] = {
        "approval": tasks.filter(
            status=TaskStatus.NEEDS_APPROVAL, deadline_at__gt=after + park, deadline_at__lte=until + park
        ).order_by("deadline_at", "pk"),
        # Only the tokenless await a model asks (S9): a client await holds a resolution token and
        # sits in `dispatched`; both conditions keep it out should either ever change.
        "question": tasks.filter(
            status=TaskStatus.AWAITING_INPUT, resolution_token__isnull=True, queued_at__gt=after, queued_at__lte=until
        ).order_by("queued_at", "pk"),
        "hold": holds.filter(held_since__gt=after, held_since__lte=until).order_by("held_since", "id"),
        "rollback": rollbacks.filter(created_at__gt=after, created_at__lte=until).order_by("created_at", "id"),
    }
    return {kind: rows for kind, rows in news.items() if kind in sub.kinds}


def has_news(sub: Subscription, *, until: datetime) -> bool:
    return any(rows.exists() for rows in _news(sub, after=sub.watermark, until=until).values())


def _since(kind: str, row: Any) -> datetime:
    """When a wait began: an approval one park length before its deadline (as the inbox reckons)."""
    if kind == "approval":
        return row.deadline_at - _park()
    if kind == "question":
        return row.queued_at
    if kind == "rollback":
        return row.created_at
    return row.held_since or row.updated_at


def _rollback(row: RolloutEvent) -> Wait:
    """A canary rolled back: its numbers beside the stable version's (counts, never words), linked
    to the agent's page; its run is the canary's latest failed one."""
    data = row.data or {}
    run_id = data.get("run")
    run = Run.objects.filter(pk=str(run_id)).first() if run_id else None
    canary, stable = data.get("canary_arm") or {}, data.get("stable_arm") or {}
    words = (
        f"canary v{row.canary_version} rolled back to v{row.stable_version}: failed {canary.get('failed')} of "
        f"{canary.get('decided')} runs, the stable version {stable.get('failed')} of {stable.get('decided')}"
    )
    base = settings.OZ0_PUBLIC_URL.rstrip("/")
    link = f"{base}/w/{row.workspace.slug}/agents/{row.agent_name}/"
    return Wait("rollback", run or Run(agent_name=row.agent_name), None, row.created_at, words, link)


def _words(user: Any, kind: str, row: Any) -> tuple[Run, str | None, str]:
    """(the run, the task named, what the subscriber may read of the wait)."""
    if kind == "hold":
        attention = row.attention or {}
        kinds = ", ".join(attention.get("kinds") or []) or attention.get("reason") or ""
        message = (row.failure or {}).get("message") if can_read_content(user, row) else None
        words = f"failure: {kinds}" if kinds else ""
        if message:
            words += f" — {message}"
        return row, (attention.get("blocked_task_keys") or [None])[0], words
    words = ""
    if can_read_content(user, row.run):
        words = f"question: {row.spec.get('question')}" if kind == "question" else f"args: {row.spec.get('args')}"
    tool = f" · tool {row.spec.get('tool')}" if kind == "approval" else ""
    return row.run, row.key + tool, words


def waits_for(sub: Subscription, *, after: datetime, until: datetime) -> tuple[list[Wait], int]:
    """The waits that are news to `sub`, oldest first (at most LISTED_MAX), and how many there are."""
    waits: list[Wait] = []
    total = 0
    for kind, rows in _news(sub, after=after, until=until).items():
        total += rows.count()
        for row in rows[:LISTED_MAX]:
            if kind == "rollback":
                waits.append(_rollback(row))
                continue
            run, task, words = _words(sub.user, kind, row)
            waits.append(Wait(kind, run, task, _since(kind, row), words))
    waits.sort(key=lambda wait: wait.since)
    return waits[:LISTED_MAX], total


def age_text(now: datetime, since: datetime) -> str:
    seconds = max(0, int((now - since).total_seconds()))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h"


def slack_escaped(text: str) -> str:
    """Text Slack shows as written: its three control characters as the entities its docs name.

    Slack reads `<...>` as a link, a mention or a broadcast (`<!channel>`, `<http://x|label>`) and
    `&` as the start of an entity; escaped, they are shown, not acted on.
    """
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def chat_literal(text: str) -> str:
    """Words from a run (a model's question, args, a failure's message) made inert for chat.

    Slack's escape (above) for Slack's `<...>` markup, then one inline code span: Mattermost and
    Rocket.Chat render Markdown and link `@channel`, `@all` and `[label](url)` in plain text, but
    show a code span literally, and so does Slack. A backtick inside would end the span, and the
    span is one line, so both are replaced.
    """
    flat = " ".join(text.replace("`", "'").split())
    return f"`{slack_escaped(flat)}`" if flat else ""


def compose(sub: Subscription, waits: list[Wait], total: int, now: datetime, *, chat: bool = False) -> tuple[str, str]:
    """(subject, text) of one digest; with `chat`, the text a Slack-compatible webhook receives.

    In a chat text every value that came from a run (agent name, task key, the words) is inert:
    it can neither mention a channel nor disguise a link.
    """
    base = settings.OZ0_PUBLIC_URL.rstrip("/")
    workspace = sub.workspace.slug
    literal = chat_literal if chat else str
    subject = f"oz0: {total} new wait{'s' if total != 1 else ''} on a person in {workspace}"
    lines = [slack_escaped(subject) if chat else subject, ""]
    for wait in waits:
        agent = f" · agent {literal(wait.run.agent_name)}" if wait.run.agent_name else ""
        task = f" · task {literal(wait.task)}" if wait.task else ""
        link = wait.link or f"{base}/runs/{wait.run.id}/"
        lines.append(f"- {wait.kind}{agent}{task} · waiting {age_text(now, wait.since)} · {link}")
        if wait.words:
            lines.append(f"  {literal(wait.words[:500])}")
    if total > len(waits):
        lines.append(f"… and {total - len(waits)} more")
    lines += ["", f"Inbox: {base}/w/{workspace}/inbox/", f"Your subscriptions: {base}/subscriptions/"]
    return subject, "\n".join(lines)


def is_due(sub: Subscription, now: datetime) -> bool:
    if sub.queued_at is not None and sub.queued_at > now - REQUEUE:
        return False
    return sub.last_digest_at is None or sub.last_digest_at + timedelta(seconds=sub.interval_seconds) <= now


def sweep(send: Callable[[int], object], now: datetime | None = None) -> list[int]:
    """Hand each due subscription with news to one delivery (`send` its id); the handed ids.

    The hand-over is a compare-and-set on `queued_at` outside any transaction, and `send` runs
    after it committed: two sweeps never hand out the same subscription twice.
    """
    now = now or timezone.now()
    handed: list[int] = []
    candidates = Subscription.objects.filter(Q(queued_at__isnull=True) | Q(queued_at__lte=now - REQUEUE)).order_by("pk")
    for sub in candidates[:SWEEP_BATCH]:
        if not is_due(sub, now) or not has_news(sub, until=now - SETTLE):
            continue
        claimed = Subscription.objects.filter(pk=sub.pk, queued_at=sub.queued_at).update(queued_at=now)
        if claimed:
            send(sub.pk)
            handed.append(sub.pk)
    return handed


def deliver(subscription_id: int, now: datetime | None = None) -> str:
    """One digest for a subscription the sweep handed out: 'sent', 'nothing' or 'not_member'.

    A channel's failure is recorded on the subscription and raised (DeliveryError) for Celery to
    retry; the watermark moves only when the digest went out, so a retry tells the same waits.
    """
    now = now or timezone.now()
    sub = Subscription.objects.filter(pk=subscription_id).select_related("user", "workspace").first()
    if sub is None or sub.queued_at is None:
        return "nothing"
    rows = Subscription.objects.filter(pk=sub.pk)
    until = now - SETTLE
    if not sub.user.is_active or role_of(sub.user, sub.workspace_id) is None:
        rows.update(
            queued_at=None, watermark=until, last_attempt_at=now, last_error="not a member of the workspace: nothing sent"
        )
        return "not_member"
    waits, total = waits_for(sub, after=sub.watermark, until=until)
    if not waits:
        rows.update(queued_at=None)
        return "nothing"
    try:
        if sub.email:
            subject, text = compose(sub, waits, total, now)
            send_email(sub.user.email, subject, text)
        if sub.webhook_url:
            post_webhook(sub.webhook_url, sub.secret, compose(sub, waits, total, now, chat=True)[1])
    except DeliveryError as error:
        rows.update(last_attempt_at=now, last_error=str(error)[:500], consecutive_failures=F("consecutive_failures") + 1)
        raise
    rows.update(
        watermark=until,
        last_digest_at=now,
        last_attempt_at=now,
        last_error="",
        consecutive_failures=0,
        queued_at=None,
        digests_sent=F("digests_sent") + 1,
    )
    return "sent"
