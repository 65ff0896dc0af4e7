"""Reads for the console's run page at any size: one narrow scan of the run's tasks gives the
counts, the fan-out groups and the graph; only the page of tasks the table shows is read whole.

A run of thousands of tasks is mostly fan-outs: many tasks of one kind, at one depth of the
`after` graph, whose keys differ only by a trailing number (`e0` … `e4999`). Such a fan-out is a
group: one node of the graph with its counts by status, one row of the groups list, a filter of
the task table. Smaller sets of look-alike tasks stay single, so a small run reads as before.

Redaction is the selectors' (`runs.selectors.task_document`, `event_document`): a group shows
keys, kinds and statuses only, which every member may see.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Max, Q

from runs.kernel import InvalidRequest, NotFound
from runs.models import TASK_ASKING, TASK_FAILED, Run, Task, TaskStatus, TraceEvent
from runs.permissions import can_read_content
from runs.selectors import (
    DocumentTask,
    children_of,
    code_document,
    event_document,
    run_cost,
    run_summary,
    session_states,
    task_document,
    waiting_for_slot,
)

# A fan-out of at least this many look-alike tasks collapses into one group.
GROUP_MIN = 8
TASKS_PER_PAGE = 50
# The graph draws at most this many nodes (groups count once): past it, the table is the way in.
GRAPH_NODES = 120
TRACE_PAGE = 50
TASK_EVENTS_SHOWN = 100
PAGE_MAX = 10**6
TASK_STATUSES = tuple(TaskStatus.values)
# The status a group shows: the most pressing of its members'.
STATUS_URGENCY = ("failed", "timed_out", "uncertain", *TASK_ASKING, "running", "dispatched", "waiting", "canceled")
TRAILING_NUMBER = re.compile(r"[._:\-]?\d+$")
GROUP_PATTERN = re.compile(r"^[A-Za-z0-9_.:\-]{0,200}\*\d{1,6}$")
EVENT_PATTERN = re.compile(r"^[a-z_]{1,40}$")
KEY_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,199}$")


def invalid(field_name: str, detail: str) -> InvalidRequest:
    return InvalidRequest(f"invalid_{field_name}", detail)


@dataclass
class TaskLine:
    """What the narrow scan reads of one task: enough to count, group and draw it."""

    key: str
    kind: str
    status: str
    after: list[str]
    child_id: Any
    depth: int = 0
    group: str = ""


@dataclass
class Group:
    id: str
    stem: str
    kind: str
    depth: int
    keys: list[str] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)

    @property
    def status(self) -> str:
        return next((s for s in STATUS_URGENCY if self.counts.get(s)), max(self.counts, key=self.counts.__getitem__))

    def as_row(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "label": f"{self.stem}* ×{len(self.keys)}",
            "kind": self.kind,
            "size": len(self.keys),
            "status": self.status,
            "counts": sorted(self.counts.items(), key=lambda item: _urgency(item[0])),
            "first": self.keys[0],
            "last": self.keys[-1],
        }


def _urgency(status: str) -> int:
    return STATUS_URGENCY.index(status) if status in STATUS_URGENCY else len(STATUS_URGENCY)


def task_lines(run: Run) -> list[TaskLine]:
    """Every task of the run, narrowly, in position order, each with its depth in the graph."""
    rows = Task.objects.filter(run=run).order_by("position").values_list("key", "kind", "status", "after", "child_id")
    lines = [TaskLine(*row) for row in rows]
    depth: dict[str, int] = {}
    for line in lines:  # sources precede their consumers in position order (append only adds after)
        line.depth = 1 + max((depth[s] for s in line.after if s in depth), default=-1)
        depth[line.key] = line.depth
    return lines


def fan_groups(lines: Sequence[TaskLine]) -> dict[str, Group]:
    """The fan-outs of at least GROUP_MIN tasks, by id `<stem>*<depth>`; their members' lines
    get the group's id (a task in no group keeps "")."""
    candidates: dict[tuple[str, str, int], list[TaskLine]] = {}
    for line in lines:
        stem = TRAILING_NUMBER.sub("", line.key)
        if stem != line.key:
            candidates.setdefault((stem, line.kind, line.depth), []).append(line)
    groups: dict[str, Group] = {}
    for (stem, kind, depth), members in candidates.items():
        if len(members) < GROUP_MIN:
            continue
        group_id = f"{stem}*{depth}"
        if group_id in groups:  # same stem and depth, another kind: keep them apart
            group_id = f"{stem}.{kind}*{depth}"
        group = groups[group_id] = Group(group_id, stem, kind, depth)
        for line in members:
            line.group = group_id
            group.keys.append(line.key)
            group.counts[line.status] += 1
    return groups


def graph_nodes(lines: Sequence[TaskLine], groups: dict[str, Group], child_status: dict[str, str]) -> dict[str, Any]:
    """The graph's nodes (a group is one node) in the shape `graph_layout` reads, at most
    GRAPH_NODES of them, the shallowest first; and how many were left out."""
    node_of = {line.key: line.group or line.key for line in lines}
    nodes: dict[str, dict[str, Any]] = {}
    for line in lines:
        node_id = node_of[line.key]
        sources = {node_of[s] for s in line.after if s in node_of}
        if node_id in nodes:
            nodes[node_id]["after"] |= sources
            continue
        group = groups.get(line.group)
        nodes[node_id] = {
            "key": node_id,
            "label": group.as_row()["label"] if group else line.key,
            "kind": line.kind,
            "status": group.status if group else line.status,
            "after": sources,
            "child": {"status": child_status[str(line.child_id)]} if str(line.child_id) in child_status else None,
            "depth": line.depth,
        }
    ordered = sorted(nodes.values(), key=lambda n: n["depth"])  # stable: position order within a depth
    shown = ordered[:GRAPH_NODES]
    for node in shown:
        node["after"] = sorted(node["after"] - {node["key"]})
    return {"nodes": shown, "hidden": len(ordered) - len(shown)}


def parse_page(value: str | None) -> int:
    if value is None or value == "":
        return 1
    if not (value.isascii() and value.isdigit()) or len(value) > 7 or not 1 <= int(value) <= PAGE_MAX:
        raise invalid("page", "`page` is a whole number from 1")
    return int(value)


def parse_status(value: str | None) -> str:
    if value and value not in TASK_STATUSES:
        raise invalid("status", f"`status` is one of {', '.join(TASK_STATUSES)}")
    return value or ""


def parse_group(value: str | None) -> str:
    if value and not GROUP_PATTERN.match(value):
        raise invalid("group", "`group` is a group's id, as the page links it (`<stem>*<depth>`)")
    return value or ""


def run_page_document(user: Any, run: Run, *, status: str = "", group: str = "", page: int = 1) -> dict[str, Any]:
    """The run page's regions for `user`: what `runs.selectors.run_document` holds, but with the
    task table as one page (filtered by status and group), the fan-outs as groups and the graph
    of at most GRAPH_NODES nodes. Every figure counts the whole run."""
    content = can_read_content(user, run)
    doc = run_summary(run, content)
    lines = task_lines(run)
    groups = fan_groups(lines)
    doc["content_visible"] = content
    doc["output"] = run.output if content else None
    doc["children"] = children_of(run, content)
    doc["waiting_for_slot"] = waiting_for_slot(run)
    doc["task_count"] = len(lines)
    doc["status_counts"] = sorted(Counter(line.status for line in lines).items(), key=lambda item: _urgency(item[0]))
    doc["has_failed"] = any(line.status in TASK_FAILED for line in lines)
    doc["groups"] = [g.as_row() for g in groups.values()]
    doc["graph"] = graph_nodes(lines, groups, {c["id"]: c["status"] for c in doc["children"]})
    doc["duration"] = run_duration(run)
    scale = timeline_scale(run)
    doc["timeline_seconds"] = (scale[1] - scale[0]).total_seconds()
    doc["usage"] = usage_of(run)
    doc["cost"] = run_cost(run)
    # Only the rounds can have loaded other code than the run's (their results name it).
    doc["code"] = code_document(
        run, Task.objects.filter(run=run, kind="round", result__has_key="code_digest").only("key", "result")
    )
    changed = DocumentTask._fields
    model_changes = Task.objects.filter(run=run, result__has_key="model_change").order_by("position").values_list(*changed)
    doc["model_changes"] = [
        (t.key, task_document(t, content, run.failure)["result"]["model_change"])  # type: ignore[index]
        for t in map(DocumentTask._make, model_changes)
    ]
    matching = [line for line in lines if (not status or line.status == status) and (not group or line.group == group)]
    pages = max(1, -(-len(matching) // TASKS_PER_PAGE))
    keys = [line.key for line in matching[(page - 1) * TASKS_PER_PAGE : page * TASKS_PER_PAGE]]
    doc["table"] = {
        "status": status,
        "group": group,
        "group_row": groups[group].as_row() if group in groups else None,
        "page": page,
        "pages": pages,
        "matching": len(matching),
        "previous": page - 1 if page > 1 else None,
        "next": page + 1 if page < pages else None,
        "rows": table_rows(run, keys, content, scale),
    }
    return doc


USAGE_KEYS = ("input_tokens", "output_tokens", "calls")
# A run's billed usage summed in the database, not by reading every result as
# `runs.selectors.billed_usage` does (the workers write whole numbers; anything else counts 0 here).
USAGE_SQL = "SELECT {} FROM runs_task WHERE run_id = %s AND jsonb_typeof(result->'usage') = 'object'".format(
    ", ".join(
        f"COALESCE(SUM(CASE WHEN jsonb_typeof(result->'usage'->'{key}') = 'number' "
        f"THEN trunc((result->'usage'->>'{key}')::numeric) ELSE 0 END), 0)"
        for key in USAGE_KEYS
    )
)


def usage_of(run: Run) -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute(USAGE_SQL, [run.pk])
        row = cursor.fetchone()
    return {key: int(value) for key, value in zip(USAGE_KEYS, row, strict=True)}


def table_rows(run: Run, keys: list[str], content: bool, scale: tuple[datetime, datetime]) -> list[dict[str, Any]]:
    """The page's tasks, whole (redacted for the reader), with their times on the run's timeline."""
    if not keys:
        return []
    fields = (*DocumentTask._fields, "queued_at", "started_at", "finished_at")
    rows = Task.objects.filter(run=run, key__in=keys).order_by("position").values_list(*fields)
    sessions = session_states(run)
    documents = []
    for row in rows:
        task = DocumentTask._make(row[: len(DocumentTask._fields)])
        doc: dict[str, Any] = dict(task_document(task, content, run.failure))
        doc["times"] = task_times(*row[len(DocumentTask._fields) :], scale=scale)
        if task.key in sessions:
            doc["session"] = sessions[task.key]
        documents.append(doc)
    return documents


TIMELINE_WIDTH = 200


def timeline_scale(run: Run) -> tuple[datetime, datetime]:
    """The run's timeline: from its creation to its end, or, while it runs, to the latest instant
    one of its tasks was stamped with (not now: what the page shows changes only with the run,
    so an unchanged run's live refresh stays a 204). The latest is the database's to find: the
    narrow scan reads no instants (turning thousands of them into datetimes costs more than
    all the rest of the scan)."""
    if run.finished_at:
        return run.created_at, run.finished_at
    latest = Task.objects.filter(run=run).aggregate(q=Max("queued_at"), s=Max("started_at"), f=Max("finished_at"))
    return run.created_at, max([run.created_at, *(v for v in latest.values() if v is not None)])


def task_times(
    queued: datetime | None, started: datetime | None, finished: datetime | None, *, scale: tuple[datetime, datetime]
) -> dict[str, Any]:
    """A task's queued, started and finished instants, its duration, and where its bar sits on
    the run's timeline (x and widths in a TIMELINE_WIDTH-wide box: waiting, then working; a
    running task's bar reaches the timeline's end)."""
    start, end = scale
    span = max((end - start).total_seconds(), 0.001)

    def x(moment: datetime) -> float:
        return round(min(max((moment - start).total_seconds() / span, 0.0), 1.0) * TIMELINE_WIDTH, 1)

    # A retried task's queued_at is its last queueing, after its first start: no wait to draw then.
    queued_shown = queued if queued and (not started or queued <= started) else None
    bar: dict[str, float | None] | None = None
    if started:
        wait_x, work_x = (x(queued_shown) if queued_shown else x(started)), x(started)
        bar = {"wait_x": wait_x, "wait_w": round(work_x - wait_x, 1), "x": work_x}
        bar["w"] = max(round(x(finished or end) - work_x, 1), 1.0)
    elif queued:
        bar = {"wait_x": x(queued), "wait_w": max(round(x(end) - x(queued), 1), 1.0), "x": None, "w": 0}
    return {
        "queued": queued,
        "started": started,
        "finished": finished,
        "seconds": (finished - started).total_seconds() if started and finished else None,
        "running": bool(started and not finished),
        "bar": bar,
    }


def run_duration(run: Run) -> dict[str, Any]:
    """A finished run's duration; a running one's ticks in the browser from its creation."""
    seconds = (run.finished_at - run.created_at).total_seconds() if run.finished_at else None
    return {"seconds": seconds, "running": run.finished_at is None}


# ---- the trace, newest first, paged and filtered ----


def parse_trace_filter(task: str | None, event: str | None) -> tuple[str, str]:
    if task and not KEY_PATTERN.match(task):
        raise invalid("task", "`task` is a task key")
    if event and not EVENT_PATTERN.match(event):
        raise invalid("event", "`event` is an event name (lower case words joined by _)")
    return task or "", event or ""


def parse_seq(value: str | None, name: str) -> int | None:
    """A seq from the query: absent is None; anything but a whole number a seq can be is a 400."""
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()) or len(value) > 19 or int(value) > 2**63 - 1:
        raise invalid(name, f"`{name}` is the seq of a trace event: a whole number from 0")
    return int(value)


def trace_filter(run: Run, task: str, event: str) -> Q:
    where = Q(run=run)
    if task:
        where &= Q(task_key=task)
    if event:
        where &= Q(event=event)
    return where


def trace_page(user: Any, run: Run, *, task: str = "", event: str = "", before: int | None = None) -> dict[str, Any]:
    """A page of the trace, newest first: TRACE_PAGE events before `before` (the newest when
    None), and the seq the next (older) page starts before, or None at the first event."""
    where = trace_filter(run, task, event)
    if before is not None:
        where &= Q(seq__lt=before)
    events = list(TraceEvent.objects.filter(where).order_by("-seq")[: TRACE_PAGE + 1])
    content = can_read_content(user, run)
    older = events[TRACE_PAGE - 1].seq if len(events) > TRACE_PAGE else None
    return {"events": [event_document(e, content) for e in events[:TRACE_PAGE]], "older": older, "task": task, "event": event}


def trace_since(user: Any, run: Run, after: int, *, task: str = "", event: str = "") -> dict[str, Any]:
    """The events after `after` matching the filter, newest first, at most a page of them;
    `gap` when more came (the browser then replaces its list with the newest page)."""
    where = trace_filter(run, task, event) & Q(seq__gt=after)
    events = list(TraceEvent.objects.filter(where).order_by("-seq")[: TRACE_PAGE + 1])
    content = can_read_content(user, run)
    gap = len(events) > TRACE_PAGE
    return {
        "events": [event_document(e, content) for e in events[:TRACE_PAGE]],
        "gap": gap,
        "older": events[TRACE_PAGE - 1].seq if gap else None,
        "task": task,
        "event": event,
    }


# ---- one task, whole: the drawer ----


def task_drawer(user: Any, run: Run, key: str) -> dict[str, Any]:
    """One task for its drawer: arguments, result, error, attempts, provider calls and the
    harness's stderr, each as `task_document` / `event_document` redact them for `user`."""
    content = can_read_content(user, run)
    fields = (*DocumentTask._fields, "queued_at", "started_at", "finished_at", "created_at")
    row = Task.objects.filter(run=run, key=key).values_list(*fields).first()
    if row is None:
        raise NotFound("task")
    task = DocumentTask._make(row[: len(DocumentTask._fields)])
    doc: dict[str, Any] = dict(task_document(task, content, run.failure))
    queued, started, finished, created = row[len(DocumentTask._fields) :]
    doc["times"] = task_times(queued, started, finished, scale=timeline_scale(run))
    doc["created_at"] = created.isoformat()
    result = dict(doc["result"] or {})
    doc["stderr"] = result.pop("stderr", None) if content else None
    doc["result"] = result or None
    doc["arguments"] = doc["spec"]
    events = TraceEvent.objects.filter(run=run, task_key=key)
    moves = list(events.exclude(event="provider_call").order_by("-seq")[: TASK_EVENTS_SHOWN + 1])
    calls = list(events.filter(event="provider_call").order_by("-seq")[: TASK_EVENTS_SHOWN + 1])
    doc["history"] = [event_document(e, content) for e in moves[:TASK_EVENTS_SHOWN]]
    doc["history_more"] = len(moves) > TASK_EVENTS_SHOWN
    doc["provider_calls"] = [event_document(e, content) for e in calls[:TASK_EVENTS_SHOWN]]
    doc["provider_calls_more"] = len(calls) > TASK_EVENTS_SHOWN
    doc["attempts"] = [e for e in doc["history"] if e["to"] in ("running", "dispatched")]
    doc["content_visible"] = content
    return doc
