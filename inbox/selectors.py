"""What waits on a person: tool calls needing approval, model questions, held runs.

Keyset-paged, oldest wait first, with a constant number of queries per page whatever
the inbox's size (one for the memberships, one per list, one per workspace's role).
The console and GET /api/v1/inbox read the same items; a hold item links to the holds
page (console/holds.py), which shows what a repairer needs.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from inbox import approvals, owners
from runs import failures, kernel
from runs.models import Run, RunStatus, Task, TaskKind, TaskStatus
from runs.permissions import behind_a_wall, can_read_content
from runs.selectors import encode_cursor, invalid_cursor, keyset_position, uuid_or_invalid_cursor
from tenancy.models import Membership, Workspace
from tenancy.permissions import has_write_standing

KINDS = ("approval", "question", "client_await", "hold")
# What waits on the person reading the inbox (the page title's count): a client's await waits on
# its client, which answers it with its token; the inbox shows it read-only.
PENDING_KINDS = ("approval", "question", "hold")

# A client's await: its token rode out in a receipt (S8), so its client answers it, not a person here.
CLIENT_AWAIT = Q(kind=TaskKind.AWAIT, status=TaskStatus.DISPATCHED, resolution_token__isnull=False)


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
    shown: dict[str, Task] = {}
    held: dict[str, Run] = {}

    # One query per waiting status (an IN over both would sort them all), each walking an
    # index in order and stopping after the page. An approval's wait is its park clock: the
    # kernel sets deadline_at when the call parks, so deadline order (the task_deadline
    # index) is wait order and the wait began one park length before it. A question is
    # ordered by when the model asked (the kernel stamps no queued_at on a task that parks
    # in the transaction that made it ready).
    # A client's await (issue 30.6) is ordered by when its run made it: its token rode out in that
    # receipt, and it waits on its client from then on.
    park = timedelta(seconds=float(settings.OZ0_APPROVAL_PARK_SECONDS))
    for wanted, waiting, clock, shift in (
        ("approval", Q(status=TaskStatus.NEEDS_APPROVAL, composed=True), "deadline_at", park),
        ("question", Q(status=TaskStatus.AWAITING_INPUT, composed=True), "created_at", timedelta(0)),
        ("client_await", CLIENT_AWAIT, "created_at", timedelta(0)),
    ):
        if wanted not in kinds or not workspace_ids:
            continue
        tasks = Task.objects.filter(waiting, run__workspace_id__in=workspace_ids).select_related(
            "run", "run__workspace", "run__agent_version", "run__created_by"
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
            shown[items[-1]["id"]] = task

    if "hold" in kinds and workspace_ids:
        runs = Run.objects.filter(status=RunStatus.NEEDS_ATTENTION, workspace_id__in=workspace_ids).select_related(
            "workspace", "created_by"
        )
        if agent:
            runs = runs.filter(agent_name=agent)
        if after_since is not None:
            same = Q(held_since=after_since, id__gt=after_id) if after_prefix == "run" else Q(pk__in=[])
            runs = runs.filter(Q(held_since__gt=after_since) | same)
        for run in runs.order_by("held_since", "id")[: limit + 1]:
            items.append(_hold_item(user, run, now))
            held[items[-1]["id"]] = run

    items.sort(key=_sort_key)
    more = len(items) > limit
    page = items[:limit]
    owners.add_owners(user, page, shown, held, now=now)
    approvals.add_context(user, page, shown)
    _add_hold_failures(user, page, held)
    next_cursor = encode_cursor([page[-1]["since"], page[-1]["id"]]) if more and page else None
    return {"items": page, "next": next_cursor}


def waiting_items(user: Any, run: Run) -> list[dict[str, Any]]:
    """One run's waiting tasks as inbox items: the run page shows them with the inbox's card."""
    park = timedelta(seconds=float(settings.OZ0_APPROVAL_PARK_SECONDS))
    now = timezone.now()
    items = []
    shown: dict[str, Task] = {}
    # A client's await (its token was given to the client) waits too: shown, read-only, with its question.
    tasks = Task.objects.filter(Q(status__in=(TaskStatus.NEEDS_APPROVAL, TaskStatus.AWAITING_INPUT)) | CLIENT_AWAIT, run=run)
    for task in tasks.order_by("position"):
        task.run = run
        # An approval waits from when it parked, one park length before its deadline.
        parked_at = task.deadline_at - park if task.deadline_at and task.status == TaskStatus.NEEDS_APPROVAL else None
        items.append(_task_item(user, task, now, parked_at or task.created_at))
        shown[items[-1]["id"]] = task
    owners.add_owners(user, items, shown, {}, now=now)
    approvals.add_context(user, items, shown)
    return items


WAITING_KINDS: dict[str, str] = {
    TaskStatus.NEEDS_APPROVAL: "approval",
    TaskStatus.AWAITING_INPUT: "question",
    TaskStatus.DISPATCHED: "client_await",
}


def _task_item(user: Any, task: Task, now: datetime, since: datetime) -> dict[str, Any]:
    run = task.run
    content = can_read_content(user, run)
    item: dict[str, Any] = {
        "id": f"task:{task.pk}",
        "kind": WAITING_KINDS.get(str(task.status), "question"),
        "run": str(run.id),
        "workspace": run.workspace.slug,
        "task": task.key,
        "agent": run.agent_name or None,
        "agent_version": run.agent_version.version if run.agent_version_id else None,  # type: ignore[union-attr]
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
    if item["kind"] == "client_await":
        item["actionable"] = False  # its client answers it, with the token it holds (S8)
    if not content and run.private:
        # Someone else's private run, told apart from a role that reads no words (issue 30.8).
        item["private_of"] = private_owner(run)
    if not content and behind_a_wall(user, run):
        item["walled"] = run.agent_name
    if content:
        item["args"] = task.spec.get("args")
        item["question"] = task.spec.get("question")
        if item["kind"] == "approval":
            # What an approval of exactly these arguments is bound to: the approver sends it back,
            # and a call that changed meanwhile is refused (approval_stale) rather than approved.
            item["digest"] = kernel.spec_digest(task.spec)
    return item


def private_owner(run: Run) -> str:
    """Whose private run this is: its creator's username ("its creator" once they are gone)."""
    creator = run.created_by if run.created_by_id else None
    return creator.username if creator is not None else "its creator"


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


def _add_hold_failures(user: Any, items: list[dict[str, Any]], held: dict[str, Run]) -> None:
    """Each hold item's first blocked failure (one query): its error key and kind for everyone,
    its message only for those who may read the run's words (F11, F12)."""
    wanted = [(item, held[item["id"]]) for item in items if item["kind"] == "hold" and item.get("task")]
    if not wanted:
        return
    where = Q()
    for item, run in wanted:
        where |= Q(run_id=run.pk, key=item["task"])
    failed = {
        (str(t.run_id), t.key): t for t in Task.objects.filter(where).only("run_id", "key", "status", "error_key", "error_detail")
    }
    for item, run in wanted:
        content = can_read_content(user, run)
        item["content_visible"] = content
        if not content and run.private:
            item["private_of"] = private_owner(run)
        if not content and behind_a_wall(user, run):
            item["walled"] = run.agent_name
        task = failed.get((str(run.pk), item["task"]))
        if task is None or not task.error_key:
            continue
        failure = failures.task_failure(task.status, task.error_key, task.error_detail, content=content)
        item["error"] = {"key": task.error_key, "detail": task.error_detail if content else None}
        item["failure_kind"] = (failure or {}).get("kind")


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


def inbox_counts(workspace: Workspace, agent: str | None = None) -> dict[str, int]:
    """How many items of each kind wait (visible to every role), of one agent's runs when the
    page filters by agent, counted up to COUNT_CAP so a huge inbox costs no more than a full one:
    the page shows "1000+" past it."""
    waiting = Task.objects.filter(composed=True, run__workspace=workspace)
    held = Run.objects.filter(workspace=workspace, status=RunStatus.NEEDS_ATTENTION)
    if agent:
        waiting = waiting.filter(run__agent_name=agent)
        held = held.filter(agent_name=agent)
    client_awaits = Task.objects.filter(CLIENT_AWAIT, run__workspace=workspace)
    if agent:
        client_awaits = client_awaits.filter(run__agent_name=agent)
    counts = {
        "approval": waiting.filter(status=TaskStatus.NEEDS_APPROVAL)[:COUNT_CAP].count(),
        "question": waiting.filter(status=TaskStatus.AWAITING_INPUT)[:COUNT_CAP].count(),
        "client_await": client_awaits[:COUNT_CAP].count(),
        "hold": held[:COUNT_CAP].count(),
    }
    counts["all"] = sum(counts.values())
    # What waits on a person here (the page title's count): not the client awaits, read-only here.
    counts["pending"] = sum(counts[kind] for kind in PENDING_KINDS)
    return counts


DRAFTS_MAX = 10


def drafts_gone(workspace: Workspace, drafts: list[str], items: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Of the calls and questions a person was typing into ("<run>:<task>", from the live refresh),
    those no longer on their page whose run is this workspace's: decided meanwhile. Malformed ones
    are hints that say nothing, so they are dropped, never refused."""
    shown = {(str(item["run"]), str(item.get("task"))) for item in items}
    wanted: dict[tuple[str, str], None] = {}
    for draft in drafts[:DRAFTS_MAX]:
        run_id, _, key = str(draft).partition(":")
        try:
            run_id = str(uuid.UUID(run_id))
        except ValueError:
            continue
        if key and len(key) <= 200 and (run_id, key) not in shown:
            wanted[(run_id, key)] = None
    if not wanted:
        return []
    here = {
        str(pk) for pk in Run.objects.filter(workspace=workspace, pk__in=[run for run, _ in wanted]).values_list("pk", flat=True)
    }
    return [(run_id, key) for run_id, key in wanted if run_id in here]
