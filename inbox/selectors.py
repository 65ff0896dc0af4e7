"""What waits on a person: tool calls needing approval, model questions, held runs.

Keyset-paged, oldest wait first, with a constant number of queries per page whatever
the inbox's size (one for the memberships, one per list, one per workspace's role).
The console and GET /api/v1/inbox read the same items; a hold item links to the holds
page (console/holds.py), which shows what a repairer needs.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from runs import kernel
from runs.models import Run, RunStatus, Task, TaskStatus
from runs.permissions import can_read_content
from runs.selectors import encode_cursor, invalid_cursor, keyset_position, uuid_or_invalid_cursor
from tenancy.models import Membership, Workspace
from tenancy.permissions import has_write_standing

KINDS = ("approval", "question", "hold")


def member_workspace_ids(user: Any, workspace: str | None = None) -> list[int]:
    memberships = Membership.objects.filter(user_id=user.pk)
    if workspace:
        memberships = memberships.filter(workspace__slug=workspace)
    return list(memberships.values_list("workspace_id", flat=True))


def _position(cursor: str | None) -> tuple[datetime | None, str, str]:
    """(since, "task"|"run", id) of the last item a page showed; a cursor of any other shape is
    refused as `invalid_cursor`."""
    position = keyset_position(cursor)
    if position is None:
        return None, "", ""
    since, item = position
    prefix, _, ident = item.partition(":") if isinstance(item, str) else ("", "", "")
    if prefix == "task" and ident.isascii() and ident.isdigit() and int(ident) < 2**63:
        return since, prefix, ident
    if prefix == "run":
        return since, prefix, str(uuid_or_invalid_cursor(ident))
    raise invalid_cursor()


def _sort_key(item: dict[str, Any]) -> tuple[str, str, int, str]:
    # Runs sort before tasks at the same instant; tasks by numeric pk, runs by uuid text,
    # exactly the order the two queries below page in.
    prefix, _, ident = item["id"].partition(":")
    return (item["since"], prefix, int(ident) if prefix == "task" else 0, ident if prefix == "run" else "")


def inbox_items(
    user: Any,
    *,
    workspace: str | None = None,
    kind: str | None = None,
    agent: str | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> dict[str, Any]:
    """One page of the inbox, oldest wait first; `next` continues after the last item."""
    workspace_ids = member_workspace_ids(user, workspace)
    kinds = [kind] if kind else list(KINDS)
    after_since, after_prefix, after_id = _position(cursor)
    now = timezone.now()
    items: list[dict[str, Any]] = []

    # One query per waiting status (an IN over both would sort them all), each walking an
    # index in order and stopping after the page. An approval's wait is its park clock: the
    # kernel sets deadline_at when the call parks, so deadline order (the task_deadline
    # index) is wait order and the wait began one park length before it. A question is
    # ordered by when the model asked (the kernel stamps no queued_at on a task that parks
    # in the transaction that made it ready).
    park = timedelta(seconds=float(settings.OZ0_APPROVAL_PARK_SECONDS))
    for wanted, status, clock, shift in (
        ("approval", TaskStatus.NEEDS_APPROVAL, "deadline_at", park),
        ("question", TaskStatus.AWAITING_INPUT, "created_at", timedelta(0)),
    ):
        if wanted not in kinds or not workspace_ids:
            continue
        tasks = Task.objects.filter(status=status, composed=True, run__workspace_id__in=workspace_ids).select_related(
            "run", "run__workspace"
        )
        if clock == "deadline_at":
            tasks = tasks.filter(deadline_at__isnull=False)
        if agent:
            tasks = tasks.filter(run__agent_name=agent)
        if after_since is not None:
            try:
                at = after_since + shift
            except OverflowError:
                raise invalid_cursor() from None
            same = Q(**{clock: at, "pk__gt": int(after_id)}) if after_prefix == "task" else Q(**{clock: at})
            tasks = tasks.filter(Q(**{f"{clock}__gt": at}) | same)
        for task in tasks.order_by(clock, "pk")[: limit + 1]:
            items.append(_task_item(user, task, now, getattr(task, clock) - shift))

    if "hold" in kinds and workspace_ids:
        runs = Run.objects.filter(status=RunStatus.NEEDS_ATTENTION, workspace_id__in=workspace_ids).select_related("workspace")
        if agent:
            runs = runs.filter(agent_name=agent)
        if after_since is not None:
            same = Q(held_since=after_since, id__gt=after_id) if after_prefix == "run" else Q(pk__in=[])
            runs = runs.filter(Q(held_since__gt=after_since) | same)
        for run in runs.order_by("held_since", "id")[: limit + 1]:
            items.append(_hold_item(user, run, now))

    items.sort(key=_sort_key)
    more = len(items) > limit
    page = items[:limit]
    next_cursor = encode_cursor([page[-1]["since"], page[-1]["id"]]) if more and page else None
    return {"items": page, "next": next_cursor}


def waiting_items(user: Any, run: Run) -> list[dict[str, Any]]:
    """One run's waiting tasks as inbox items: the run page shows them with the inbox's card."""
    park = timedelta(seconds=float(settings.OZ0_APPROVAL_PARK_SECONDS))
    now = timezone.now()
    items = []
    tasks = Task.objects.filter(run=run, status__in=(TaskStatus.NEEDS_APPROVAL, TaskStatus.AWAITING_INPUT))
    for task in tasks.order_by("position"):
        task.run = run
        # An approval waits from when it parked, one park length before its deadline.
        parked_at = task.deadline_at - park if task.deadline_at and task.status == TaskStatus.NEEDS_APPROVAL else None
        items.append(_task_item(user, task, now, parked_at or task.created_at))
    return items


def _task_item(user: Any, task: Task, now: datetime, since: datetime) -> dict[str, Any]:
    run = task.run
    content = can_read_content(user, run)
    item: dict[str, Any] = {
        "id": f"task:{task.pk}",
        "kind": "approval" if task.status == TaskStatus.NEEDS_APPROVAL else "question",
        "run": str(run.id),
        "workspace": run.workspace.slug,
        "task": task.key,
        "agent": run.agent_name or None,
        "since": since.isoformat(),
        "waited_seconds": max(0, int((now - since).total_seconds())),
        "deadline": task.deadline_at.isoformat() if task.deadline_at else None,
        "remaining_seconds": max(0, int((task.deadline_at - now).total_seconds())) if task.deadline_at else None,
        "tool": task.spec.get("tool"),
        "content_visible": content,
        # Whether this person may decide it: an operator who can read what is decided (F11); someone
        # else's private run is never decided blind.
        "actionable": content and has_write_standing(user, run.workspace_id),
    }
    if content:
        item["args"] = task.spec.get("args")
        item["question"] = task.spec.get("question")
        if item["kind"] == "approval":
            # What an approval of exactly these arguments is bound to: the approver sends it back,
            # and a call that changed meanwhile is refused (approval_stale) rather than approved.
            item["digest"] = kernel.spec_digest(task.spec)
    return item


def _hold_item(user: Any, run: Run, now: datetime) -> dict[str, Any]:
    since = run.held_since or run.updated_at
    attention = run.attention or {}
    return {
        "id": f"run:{run.id}",
        "kind": "hold",
        "run": str(run.id),
        "workspace": run.workspace.slug,
        "task": (attention.get("blocked_task_keys") or [None])[0],
        "agent": run.agent_name or None,
        "since": since.isoformat(),
        "waited_seconds": max(0, int((now - since).total_seconds())),
        "reason": attention.get("reason"),
        "blocked_task_keys": attention.get("blocked_task_keys", []),
        "kinds": attention.get("kinds", []),
        # A held child run (F14): its parent waits on it; holds have no clock, so say who waits.
        "parent": str(run.parent_id) if run.parent_id else None,
    }


def inbox_agents(workspace: Workspace) -> list[str]:
    """Agent names of the workspace's unfinished runs (the inbox's agent filter): only an
    unfinished run has anything waiting on a person."""
    names = (
        Run.objects.filter(workspace=workspace, status__in=(RunStatus.RUNNING, RunStatus.NEEDS_ATTENTION, RunStatus.PAUSED))
        .exclude(agent_name="")
        .values_list("agent_name", flat=True)
        .order_by()
        .distinct()
    )
    return sorted(names[:200])


COUNT_CAP = 1000


def inbox_counts(workspace: Workspace) -> dict[str, int]:
    """How many items of each kind wait (visible to every role), counted up to COUNT_CAP so a
    huge inbox costs no more than a full one: the page shows "1000+" past it."""
    waiting = Task.objects.filter(composed=True, run__workspace=workspace)
    counts = {
        "approval": waiting.filter(status=TaskStatus.NEEDS_APPROVAL)[:COUNT_CAP].count(),
        "question": waiting.filter(status=TaskStatus.AWAITING_INPUT)[:COUNT_CAP].count(),
        "hold": Run.objects.filter(workspace=workspace, status=RunStatus.NEEDS_ATTENTION)[:COUNT_CAP].count(),
    }
    counts["all"] = sum(counts.values())
    return counts
