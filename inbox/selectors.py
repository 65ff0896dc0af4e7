"""What waits on a person: tool calls needing approval, model questions, held runs.

Keyset-paged, newest waits last-in-first-seen by `since`, with a constant number of
queries per page whatever the inbox's size.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from runs.models import Membership, Run, RunStatus, Task, TaskStatus
from runs.permissions import can_read_content
from runs.selectors import decode_cursor, encode_cursor

KINDS = ("approval", "question", "hold")


def member_workspace_ids(user: Any, workspace: str | None = None) -> list[int]:
    memberships = Membership.objects.filter(user_id=user.pk)
    if workspace:
        memberships = memberships.filter(workspace__slug=workspace)
    return list(memberships.values_list("workspace_id", flat=True))


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
    position = decode_cursor(cursor)
    after_since = parse_datetime(str(position[0])) if position else None
    after_id = str(position[1]) if position else ""
    now = timezone.now()
    items: list[dict[str, Any]] = []

    if "approval" in kinds or "question" in kinds:
        statuses = []
        if "approval" in kinds:
            statuses.append(TaskStatus.NEEDS_APPROVAL)
        if "question" in kinds:
            statuses.append(TaskStatus.AWAITING_INPUT)
        tasks = Task.objects.filter(status__in=statuses, composed=True, run__workspace_id__in=workspace_ids).select_related(
            "run", "run__workspace"
        )
        if agent:
            tasks = tasks.filter(run__agent_name=agent)
        if after_since is not None:
            tasks = tasks.filter(Q(queued_at__gt=after_since) | Q(queued_at=after_since, pk__gt=_task_pk(after_id)))
        for task in tasks.order_by("queued_at", "pk")[: limit + 1]:
            items.append(_task_item(user, task, now))

    if "hold" in kinds:
        runs = Run.objects.filter(status=RunStatus.NEEDS_ATTENTION, workspace_id__in=workspace_ids).select_related("workspace")
        if agent:
            runs = runs.filter(agent_name=agent)
        if after_since is not None:
            runs = runs.filter(held_since__gt=after_since)
        for run in runs.order_by("held_since", "id")[: limit + 1]:
            items.append(_hold_item(user, run, now))

    items.sort(key=lambda item: (item["since"], item["id"]))
    more = len(items) > limit
    page = items[:limit]
    next_cursor = encode_cursor([page[-1]["since"], page[-1]["id"]]) if more and page else None
    return {"items": page, "next": next_cursor}


def _task_pk(item_id: str) -> int:
    try:
        return int(item_id.split(":", 1)[1])
    except (IndexError, ValueError):
        return 0


def _task_item(user: Any, task: Task, now: datetime) -> dict[str, Any]:
    run = task.run
    content = can_read_content(user, run)
    since = task.queued_at or task.created_at
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
    }
    if content:
        item["args"] = task.spec.get("args")
        item["question"] = task.spec.get("question")
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
    }
