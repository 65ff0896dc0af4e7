"""What waits on a person: tool calls needing approval, model questions, held runs.

Keyset-paged, oldest wait first, with a constant number of queries per page whatever
the inbox's size (one for the memberships, one per list, one per workspace's role).
The console and GET /api/v1/inbox read the same items; the holds page reads
`held_runs`, which batches the trace reads its repair candidates need.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from runs import failures
from runs.kernel.graph import repair_candidates
from runs.models import TASK_FAILED, Membership, Run, RunStatus, Task, TaskStatus, TraceEvent, Workspace
from runs.permissions import can_read_content
from runs.selectors import encode_cursor, invalid_cursor, keyset_position, task_error, uuid_or_invalid_cursor

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
        "kinds": attention.get("kinds", []),
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


# ---- holds: held runs with what a repairer needs ----


def held_runs(user: Any, workspace: Workspace, *, run_ids: list[Any] | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """Held runs, oldest hold first, each with its failed tasks and repair candidates.

    Three queries whatever the page's size: the runs, their failed tasks, their traces.
    """
    runs_qs = Run.objects.filter(workspace=workspace, status=RunStatus.NEEDS_ATTENTION).select_related("workspace")
    if run_ids is not None:
        runs_qs = runs_qs.filter(pk__in=run_ids)
    runs = list(runs_qs.order_by("held_since", "id")[:limit])
    return hold_documents(user, runs)


def hold_documents(user: Any, runs: list[Run]) -> list[dict[str, Any]]:
    if not runs:
        return []
    ids = [r.pk for r in runs]
    failed: dict[Any, list[Task]] = defaultdict(list)
    for task in Task.objects.filter(run_id__in=ids, status__in=TASK_FAILED).order_by("position"):
        failed[task.run_id].append(task)
    traces: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    rows = (
        TraceEvent.objects.filter(run_id__in=ids)
        .order_by("run_id", "seq")
        .values_list("run_id", "task_key", "event", "to_status", "error", "data")
    )
    for run_id, key, event, to, error, data in rows:
        traces[run_id].append({"task": key, "event": event, "to": to, "error": error, "data": data})
    now = timezone.now()
    return [hold_document(user, run, failed[run.pk], repair_candidates(traces[run.pk]), now) for run in runs]


def hold_document(user: Any, run: Run, failed_tasks: list[Task], candidates: list[str], now: datetime) -> dict[str, Any]:
    content = can_read_content(user, run)
    attention = run.attention or {}
    since = run.held_since or run.updated_at
    return {
        "run": str(run.id),
        "agent": run.agent_name or None,
        "status": run.status,
        "reason": attention.get("reason"),
        "blocked_task_keys": attention.get("blocked_task_keys", []),
        "kinds": attention.get("kinds", []),
        "since": since,
        "waited_seconds": max(0, int((now - since).total_seconds())),
        "content_visible": content,
        "candidates": candidates,
        "failed": [failed_task_document(t, content, t.key in candidates) for t in failed_tasks],
    }


def failed_task_document(task: Task, content: bool, candidate: bool) -> dict[str, Any]:
    failure = failures.task_failure(task.status, task.error_key, task.error_detail, content=content) or {}
    return {
        "key": task.key,
        "task_kind": task.kind,
        "status": task.status,
        "on_failure": task.on_failure,
        "attempt": task.attempt,
        "error": task_error(task, content),
        "failure": failure,
        "failure_resolution": task.failure_resolution,
        "kind": failure.get("kind"),
        "retryable": failure.get("retryable"),
        "partial": failure.get("partial"),
        "person": failure.get("person"),
        "declared": failure.get("declared"),
        "candidate": candidate,
        "compactable": candidate and task.kind == "round",
    }


def last_decision(run: Run, key: str) -> dict[str, Any]:
    """Who last acted on a task and how (what a person who lost a race is told)."""
    events = TraceEvent.objects.filter(run=run, task_key=key).order_by("-seq")
    event = events.filter(event="verb").first() or events.exclude(actor__in=("", "worker", "model", "kernel")).first()
    task = Task.objects.filter(run=run, key=key).only("status").first()
    return {
        "verb": ((event.data or {}).get("verb") or event.to_status) if event else None,
        "actor": event.actor if event else "",
        "at": event.at if event else None,
        "status": task.status if task else None,
    }
