"""Reads of runs, tasks and the trace, with the permission filter and the redaction rule.

Every surface that shows a run (the API, the console, the pushes) builds its view
through these functions, so what a closed reader may see is decided in one place
(`runs.permissions.can_read_content` + the `redact_*` helpers of `runs.failures`).
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, NamedTuple

from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from runs import failures
from runs.kernel import InvalidRequest, NotFound, priority_name, quota_limits, repair_candidates_of, spec_digest
from runs.models import RUN_OPEN, Run, Task, TaskKind, TaskStatus, TraceEvent
from runs.permissions import can_read_content
from runs.schemas import FirstApproval, TaskDocument
from runs.usage_prices import model_of, usage_cost
from tenancy.models import Membership, Workspace
from tenancy.permissions import role_of

# Trace event data a closed reader may see: structure, statuses, flags and counts, never words.
STRUCTURAL_DATA_KEYS = frozenset(
    {
        "kind",
        "after",
        "on_failure",
        "mode",
        "composed",
        "resolution",
        "verb",
        "announcement",
        "reason",
        "blocked_task_keys",
        "route",
        "attempt",
        "status",
        "outcome",
        "usage",
        "from",
        "to",
        "used",
        "budget",
        "replayed",
        "by",
        "agent",
        "version",
        "rollout",
        "keys",
        "deliverable",
        "messages",
        "finish",
        "kinds",
        "exception",
        # Delegation (F12): a child's id, its parent, status, kind and flags; never its words.
        "child",
        "parent",
        "parent_task",
        "via",
        "depth",
        "steps",
        "retryable",
        "partial",
        "person",
        "declared",
        "decided",
        # An approval a person gave to arguments they edited (the arguments themselves are words).
        "edited",
        # A model call's (issue 29): which model, whose, how long, how many requests, which harness.
        "model",
        "provider",
        "duration_ms",
        "calls",
        "harness",
    }
)


@lru_cache(maxsize=4096)
def workspace_of(run_id: str | None) -> int | None:
    """The workspace a run belongs to (it never moves: cached per process), None for no run."""
    if run_id is None:
        return None
    try:
        return Run.objects.filter(pk=run_id).values_list("workspace_id", flat=True).first()
    except (ValueError, ValidationError):
        return None


def workspace_for(user: Any, slug: str) -> Workspace:
    workspace = Workspace.objects.filter(slug=slug).first()
    if workspace is None or role_of(user, workspace.pk) is None:
        raise NotFound("workspace")
    return workspace


def workspaces_of(user: Any) -> QuerySet[Membership]:
    return Membership.objects.filter(user=user).select_related("workspace").order_by("workspace__slug")


def run_for(user: Any, run_id: Any) -> Run:
    """A run the user is a member of the workspace of; anything else is 404."""
    try:
        run = Run.objects.select_related("workspace", "agent_version").get(pk=run_id)
    except (Run.DoesNotExist, ValueError, TypeError, ValidationError):
        raise NotFound("run") from None
    if role_of(user, run.workspace_id) is None:
        raise NotFound("run")
    return run


def task_error(task: Task | DocumentTask, content: bool) -> dict[str, Any] | None:
    error = task.error
    return error if content else failures.redact_task_error(error)


def task_document(task: Task | DocumentTask, content: bool, run_failure: dict[str, Any] | None = None) -> TaskDocument:
    result = task.result
    if not content and result is not None:
        result = {
            k: v for k, v in result.items() if k in ("model_change", "usage", "route", "child", "agent", "via", "code_digest")
        }
        if isinstance(result.get("model_change"), dict):
            # A refusal's category is the classifier's reading of the words: the same allowlist as the trace's.
            result["model_change"] = {k: v for k, v in result["model_change"].items() if k in STRUCTURAL_DATA_KEYS}
    if content:
        spec = {k: v for k, v in task.spec.items() if k != "script"}
    else:
        spec = {k: v for k, v in task.spec.items() if k in ("tool", "model", "mode", "quorum", "fallback_models", "agent", "via")}
    return {
        "key": task.key,
        "kind": task.kind,
        "status": task.status,
        "after": list(task.after),
        "on_failure": task.on_failure,
        "attempt": task.attempt,
        "lineage": task.lineage,
        "composed": task.composed,
        "error": task_error(task, content),
        "failure": failures.step_failure(
            task.status, task.error_key, task.error_detail, content=content, run_failure=run_failure, result=task.result
        ),
        "failure_resolution": task.failure_resolution,
        "result": result,
        "spec": spec,
    }


def run_summary(run: Run, content: bool) -> dict[str, Any]:
    failure = run.failure if content else failures.redact_failure(run.failure)
    return {
        "id": str(run.id),
        "workspace": run.workspace.slug,
        "agent": run.agent_name or None,
        "agent_version": run.agent_version.version if run.agent_version_id else None,  # type: ignore[union-attr]
        "status": run.status,
        "attention": run.attention,
        "announcements": list(run.announcements),
        "deliverable": run.deliverable or None,
        "private": run.private,
        "error": run.error if content else failures.redact_error_text(run.error, run.failure),
        "failure": failure,
        "created_at": run.created_at.isoformat(),
        "updated_at": run.updated_at.isoformat(),
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        "last_seq": run.last_seq,
        # Delegation: the parent run and the delegate task that started this one (F14).
        "parent": str(run.parent_id) if run.parent_id else None,
        "parent_task": run.parent_task_key or None,
        "depth": run.depth,
        # Another agent's words reached this run unlabelled (F15): its composed calls wait for a person.
        "tainted": run.tainted,
        # The version of the agent's code when the run was created (oz0agents.code_version).
        "code_digest": run.code_digest or None,
        # 0-9, orders the dispatch of its calls (runs.kernel.priorities), and its word.
        "priority": run.priority,
        "priority_name": priority_name(run.priority),
        # The arm of its agent's canary rollout it was assigned to (oz0agents.assignment), or null.
        "rollout": run.rollout or None,
    }


class DocumentTask(NamedTuple):
    """The columns of a task its document shows, read as a tuple: a run of thousands of tasks
    answers its document without building a model instance per task (most of its cost)."""

    key: str
    kind: str
    status: str
    after: list[str]
    on_failure: str
    attempt: int
    lineage: str
    composed: bool
    error_key: str | None
    error_detail: str | None
    failure_resolution: str | None
    result: dict[str, Any] | None
    spec: dict[str, Any]
    child_id: uuid.UUID | None

    @property
    def error(self) -> dict[str, str | None] | None:
        return None if self.error_key is None else {"key": self.error_key, "detail": self.error_detail}


def document_tasks(run: Run) -> list[DocumentTask]:
    rows = Task.objects.filter(run=run).order_by("position").values_list(*DocumentTask._fields)
    return [DocumentTask._make(row) for row in rows]


def run_document(user: Any, run: Run, tasks: Iterable[Task] | None = None) -> dict[str, Any]:
    content = can_read_content(user, run)
    doc = run_summary(run, content)
    rows: Sequence[Task | DocumentTask] = list(tasks) if tasks is not None else document_tasks(run)
    doc["output"] = run.output if content else None
    doc["input"] = run.input if content else None
    doc["content_visible"] = content
    doc["tasks"] = [task_document(t, content, run.failure) for t in rows]
    doc["usage"] = billed_usage(rows)
    # What only some tasks can have is asked of the database only when the run has such a task:
    # a read of a run of plain tool calls makes four queries fewer. Model calls are a round's.
    kinds, task_statuses = {t.kind for t in rows}, {t.status for t in rows}
    doc["cost"] = run_cost(run) if TaskKind.ROUND in kinds else usage_cost([])
    doc["code"] = code_document(run, rows)
    doc["children"] = children_of(run, content) if TaskKind.DELEGATE in kinds else []
    round_waits = TaskKind.ROUND in kinds and TaskStatus.WAITING in task_statuses
    doc["waiting_for_slot"] = waiting_for_slot(run) if round_waits else None
    sessions = session_states(run)
    approvals = first_approvals(run) if TaskStatus.NEEDS_APPROVAL in task_statuses else {}
    for task_doc in doc["tasks"]:
        if task_doc["key"] in sessions:
            task_doc["session"] = sessions[task_doc["key"]]
        if task_doc["key"] in approvals:
            task_doc["first_approval"] = approvals[task_doc["key"]]
    # A delegate task names its (latest) child and that child's status: the graph draws it.
    statuses = {child["id"]: child["status"] for child in doc["children"]}
    for task, task_doc in zip(rows, doc["tasks"], strict=True):
        if task.child_id is not None and str(task.child_id) in statuses:
            task_doc["child"] = {"id": str(task.child_id), "status": statuses[str(task.child_id)]}
    return doc


def first_approvals(run: Run) -> dict[str, FirstApproval]:
    """The calls of the run waiting for a second approver, by key: who gave the first approval and
    when. An approval counts for the call it was given to (its digest): an edit since starts over,
    as the kernel's approve counts it. One query over the calls that hold an approval."""
    rows = Task.objects.filter(run=run, status=TaskStatus.NEEDS_APPROVAL, state__has_key="approvals").values_list(
        "key", "spec", "state__approvals"
    )
    firsts: dict[str, FirstApproval] = {}
    for key, spec, approvals in rows:
        digest = spec_digest(spec)
        given = [a for a in approvals or [] if a.get("digest") == digest]
        if given:
            firsts[key] = {"by": str(given[0].get("by")), "at": str(given[0].get("at"))}
    return firsts


def waiting_for_slot(run: Run) -> dict[str, Any] | None:
    """A harnessed round of the run queued for a session thread its workspace has none of
    (OZ0_SESSION_SLOTS_PER_WORKSPACE in use): `{task, since, slots}`, else None."""
    row = (
        Task.objects.filter(run=run, kind="round", status=TaskStatus.WAITING, ready=True, state__has_key="waiting_for_slot")
        .values_list("key", "state")
        .first()
    )
    if row is None:
        return None
    return {"task": row[0], **row[1]["waiting_for_slot"]}


def session_states(run: Run) -> dict[str, str | None]:
    """Where each harnessed round of the run stands as a session (F7, issue 29), by key: `active`
    (a thread drives it), `released` (waiting on a person: its process kept, no thread nor slot
    held), `parked` (waiting on a person: its state stored, no process), `waiting_for_slot`,
    `queued`, or None once it ended. Empty for a run of oz0's own loop. One query, reading only
    the state's markers."""
    if run.agent_version_id is None or not (run.agent_version.manifest or {}).get("harness"):  # type: ignore[union-attr]
        return {}
    rows = Task.objects.filter(run=run, kind="round").values_list(
        "key", "status", "ready", "state__released", "state__parked", "state__waiting_for_slot"
    )
    states: dict[str, str | None] = {}
    for key, status, ready, released, parked, slot in rows:
        if status == TaskStatus.RUNNING:
            states[key] = "released" if released is not None else "active"
        elif status == TaskStatus.WAITING and parked is not None and not ready:
            states[key] = "parked"
        elif status == TaskStatus.WAITING and ready:
            states[key] = "waiting_for_slot" if slot is not None else "queued"
        else:
            states[key] = None
    return states


def children_of(run: Run, content: bool) -> list[dict[str, Any]]:
    """A run's child runs (delegate tasks' children), oldest first: status, kind and flags, never
    the child's words (F12, F15: a quarantined child's message must not reach its parent's
    document); the child's own document has them for those who may read it."""
    rows = (
        Run.objects.filter(parent=run)
        .order_by("created_at")
        .values("id", "parent_task_key", "agent_name", "status", "failure", "depth")
    )
    return [
        {
            "id": str(row["id"]),
            "task": row["parent_task_key"],
            "agent": row["agent_name"] or None,
            "status": row["status"],
            "depth": row["depth"],
            "failure": failures.redact_failure(row["failure"]),
        }
        for row in rows
    ]


def billed_usage(tasks: Iterable[Task | DocumentTask]) -> dict[str, int]:
    total = {"input_tokens": 0, "output_tokens": 0, "calls": 0}
    for task in tasks:
        usage = (task.result or {}).get("usage") or {}
        for key in total:
            total[key] += int(usage.get(key, 0) or 0)
    return total


def run_cost(run: Run) -> dict[str, Any]:
    """The run's model calls (its `provider_call` events, oz0's loop's and the frameworks' alike)
    priced per call: tokens, calls, the cost in dollars and the models with no known price."""
    # Only the keys priced: an event of oz0's loop also holds the request's messages.
    calls = TraceEvent.objects.filter(run=run, event="provider_call").values_list(
        "data__route", "data__model", "data__provider", "data__usage", "data__calls"
    )
    rows = []
    for route, model_name, provider_name, usage, calls_made in calls:
        model, provider = model_of({"route": route, "model": model_name, "provider": provider_name})
        rows.append((model, provider, _tokens(usage, "input_tokens"), _tokens(usage, "output_tokens"), _count(calls_made, 1)))
    return usage_cost(rows)


def _tokens(usage: Any, key: str) -> int:
    return _count(usage.get(key) if isinstance(usage, dict) else None, 0)


def _count(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def code_document(run: Run, tasks: Iterable[Task | DocumentTask]) -> dict[str, Any] | None:
    """The version of the agent's code the run ran (oz0agents.code_version): the digest recorded
    when the run was created, the one its version was registered with, whether they differ (the
    code changed under the same manifest), and the rounds that loaded code other than the run's."""
    version = run.agent_version.code_digest if run.agent_version_id else ""  # type: ignore[union-attr]
    if not run.code_digest and not version:
        return None
    rounds = [
        task.key
        for task in tasks
        if (task.result or {}).get("code_digest") and (task.result or {})["code_digest"] != run.code_digest
    ]
    return {
        "digest": run.code_digest or None,
        "version_digest": version or None,
        "changed_since_version": bool(version and run.code_digest != version),
        "rounds_on_other_code": rounds,
    }


def event_document(event: TraceEvent, content: bool) -> dict[str, Any]:
    data = event.data
    if not content and data is not None:
        data = {k: v for k, v in data.items() if k in STRUCTURAL_DATA_KEYS}
    error = event.error if content else failures.redact_task_error(event.error)
    return {
        "seq": event.seq,
        "at": event.at.isoformat(),
        "task": event.task_key,
        "event": event.event,
        "from": event.from_status,
        "to": event.to_status,
        "error": error,
        "actor": event.actor,
        "data": data,
    }


def trace_events(run: Run, *, after: int = 0, limit: int | None = None) -> list[TraceEvent]:
    events = TraceEvent.objects.filter(run=run, seq__gt=after).order_by("seq")
    if limit is not None:
        events = events[:limit]
    return list(events)


def trace_documents(user: Any, run: Run, *, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
    content = can_read_content(user, run)
    return [event_document(e, content) for e in trace_events(run, after=after, limit=limit)]


def candidates(run: Run) -> list[str]:
    """Retry/abandon candidates, computed from the trace by the kernel's own rule (S15, S16)."""
    return repair_candidates_of([run.pk])[run.pk]


# ---- lists with keyset paging ----


def encode_cursor(values: Sequence[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(values)).encode()).decode().rstrip("=")


def invalid_cursor() -> InvalidRequest:
    return InvalidRequest("invalid_cursor", "the cursor is not one this server gave")


def decode_cursor(cursor: str | None) -> list[Any] | None:
    if not cursor:
        return None
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        values = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (ValueError, RecursionError):
        raise invalid_cursor() from None
    if not isinstance(values, list):
        raise invalid_cursor()
    return values


def keyset_position(cursor: str | None) -> tuple[datetime, Any] | None:
    """The (instant, id) a keyset cursor holds, or None for the first page.

    Anything but a pair whose first member is a real ISO instant is refused as `invalid_cursor`
    (a 400), whatever the caller then makes of the id; a naive instant is read as UTC.
    """
    values = decode_cursor(cursor)
    if values is None:
        return None
    if len(values) != 2 or not isinstance(values[0], str):
        raise invalid_cursor()
    try:
        moment = parse_datetime(values[0])
    except ValueError:  # well formed but no such day, e.g. 2024-02-30
        moment = None
    if moment is None:
        raise invalid_cursor()
    if timezone.is_naive(moment):
        moment = moment.replace(tzinfo=UTC)
    try:
        moment.astimezone(UTC)
    except OverflowError:
        raise invalid_cursor() from None
    return moment, values[1]


def uuid_or_invalid_cursor(value: Any) -> uuid.UUID:
    if not isinstance(value, str):
        raise invalid_cursor()
    try:
        return uuid.UUID(value)
    except ValueError:
        raise invalid_cursor() from None


def workspace_quotas(workspace: Workspace) -> list[dict[str, Any]]:
    """The workspace's quotas with what it uses of each (the Settings page): runs not finished and
    the bytes its runs' inputs store; tasks a run holds are checked at each create and append."""
    limits = quota_limits()
    stored = Workspace.objects.filter(pk=workspace.pk).values_list("stored_input_bytes", flat=True).get()
    active = Run.objects.filter(workspace_id=workspace.pk, status__in=RUN_OPEN).count()
    rows = [
        ("active_runs", "Runs not finished", active, "runs"),
        ("tasks_per_run", "Tasks in one run", None, "tasks"),
        ("input_bytes", "Stored run inputs", int(stored), "bytes"),
    ]
    return [
        {
            "quota": quota,
            "label": label,
            "limit": limits[quota] or None,
            "used": used,
            "unit": unit,
            "percent": min(100, round(100 * used / limits[quota])) if used is not None and limits[quota] else None,
        }
        for quota, label, used, unit in rows
    ]
