"""The audit trail: who did what to which run, when and why, read from the trace.

A person's verb leaves one trace event in the same transaction as its moves (`event="verb"`
with `data.verb`; an append leaves `event="appended"`), with the person's name as `actor`. The
trail is those events, newest first, per workspace: nothing is written twice, and nothing a verb
did escapes it. The words a verb carries (a deny or cancel reason, an await's error, an answer's
value) are shown only to those who may read the run's content (`can_read_content`); everyone
else sees who, what, when and on which task.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from django.db.models import Q, QuerySet
from django.db.models.fields.json import KT
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from runs.kernel import InvalidRequest
from runs.models import Run, TraceEvent
from runs.permissions import can_read_content
from runs.selectors import encode_cursor, invalid_cursor, keyset_position
from tenancy.models import Workspace

# The verbs the trail records, as the kernel names them; `append` is the `appended` event. The
# platform's own entries about waiting work (actor `oz0`): a call assigned to its approver groups
# when it parks, a wait's owners reminded, a wait escalated (tenancy/approvers.py, notify/deadlines.py).
PERSON_VERBS = ("approve", "deny", "answer", "resolve", "retry", "abandon", "compact", "append", "cancel", "pause", "resume")
WAIT_VERBS = ("assign", "remind", "escalate")
VERBS = PERSON_VERBS + WAIT_VERBS
AUDIT_EVENTS = ("verb", "appended")
MAX_LIMIT = 200
FILTER_TEXT_MAX = 150  # an actor is a username (150 characters at most)
# The trail's columns; CSV cells are these, in this order.
CSV_COLUMNS = (
    "at",
    "actor",
    "verb",
    "run",
    "task",
    "agent",
    "reason",
    "answer",
    "tasks",
    "content_visible",
    "edited",
    "original_args",
    "args",
    "note",
)
# A cell a spreadsheet would read as a formula starts with one of these (OWASP: CSV injection).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def audit_events() -> QuerySet[TraceEvent]:
    """Every workspace's audit events; the partial index `trace_audit_at` serves this filter."""
    return TraceEvent.objects.filter(event__in=AUDIT_EVENTS)


def parse_filters(
    *,
    actor: str | None = None,
    verb: str | None = None,
    run: str | None = None,
    since: str | None = None,
    until: str | None = None,
) -> dict[str, Any]:
    """Filters from a query string, each checked: anything malformed is a typed 400."""
    filters: dict[str, Any] = {}
    if actor:
        if len(actor) > FILTER_TEXT_MAX:
            raise InvalidRequest("invalid_field", f"`actor` is a username: at most {FILTER_TEXT_MAX} characters")
        filters["actor"] = actor
    if verb:
        if verb not in VERBS:
            raise InvalidRequest("invalid_verb", f"`verb` must be one of {', '.join(VERBS)}")
        filters["verb"] = verb
    if run:
        try:
            if len(run) > 64:
                raise ValueError(run[:64])
            filters["run"] = uuid.UUID(run)
        except ValueError:
            raise InvalidRequest("invalid_field", "`run` must be a run's id") from None
    for name, value in (("since", since), ("until", until)):
        if value:
            filters[name] = _instant(name, value)
    return filters


def _instant(name: str, value: str) -> datetime:
    try:
        moment = parse_datetime(value) if len(value) <= 64 else None
    except ValueError:  # well formed but no such day
        moment = None
    if moment is None:
        raise InvalidRequest("invalid_field", f"`{name}` must be an ISO 8601 time, e.g. 2026-12-01T14:00:00Z")
    if timezone.is_naive(moment):
        moment = moment.replace(tzinfo=UTC)
    try:
        moment.astimezone(UTC)
    except OverflowError:
        raise InvalidRequest("invalid_field", f"`{name}` is out of range") from None
    return moment


def filtered(workspace: Workspace, filters: dict[str, Any]) -> QuerySet[TraceEvent]:
    events = audit_events().filter(run__workspace_id=workspace.pk)
    if "actor" in filters:
        events = events.filter(actor=filters["actor"])
    verb = filters.get("verb")
    if verb == "append":
        events = events.filter(event="appended")
    elif verb:
        # data->>'verb', the expression the index `trace_audit_verb` is built on.
        events = events.alias(audit_verb=KT("data__verb")).filter(event="verb", audit_verb=verb)
    if "run" in filters:
        events = events.filter(run_id=filters["run"])
    if "since" in filters:
        events = events.filter(at__gte=filters["since"])
    if "until" in filters:
        events = events.filter(at__lt=filters["until"])
    # Only what the rule and the page need of the run: never its input or output.
    return events.select_related("run").only(
        "id",
        "at",
        "seq",
        "task_key",
        "event",
        "actor",
        "data",
        "run__id",
        "run__workspace_id",
        "run__private",
        "run__created_by_id",
        "run__agent_name",
    )


def _after(events: QuerySet[TraceEvent], cursor: str | None) -> QuerySet[TraceEvent]:
    position = keyset_position(cursor)
    if position is None:
        return events
    moment, last_id = position
    if not isinstance(last_id, int) or isinstance(last_id, bool) or not 0 < last_id < 2**63:
        raise invalid_cursor()
    return events.filter(Q(at__lt=moment) | Q(at=moment, id__lt=last_id))


def audit_page(
    user: Any, workspace: Workspace, filters: dict[str, Any], *, cursor: str | None = None, limit: int = 50
) -> dict[str, Any]:
    """One page of the trail, newest first, with a keyset cursor to the next."""
    limit = max(1, min(int(limit), MAX_LIMIT))
    page = list(_after(filtered(workspace, filters), cursor).order_by("-at", "-id")[: limit + 1])
    more = len(page) > limit
    page = page[:limit]
    items = [entry_document(user, event) for event in page]
    next_cursor = encode_cursor([page[-1].at.isoformat(), page[-1].pk]) if more and page else None
    return {"items": items, "next": next_cursor}


def entry_document(user: Any, event: TraceEvent) -> dict[str, Any]:
    run: Run = event.run
    content = can_read_content(user, run)
    data = event.data or {}
    verb = "append" if event.event == "appended" else str(data.get("verb", ""))
    has_value = verb == "answer" or (verb == "resolve" and data.get("outcome") == "value")
    return {
        "id": event.pk,
        "at": event.at.isoformat(),
        "actor": event.actor,
        "verb": verb,
        "run": str(run.id),
        "task": event.task_key,
        "agent": run.agent_name or None,
        "outcome": data.get("outcome"),
        "tasks": list(data.get("keys") or []) if verb == "append" else None,
        "content_visible": content,
        # The words: present (possibly null) for those who may read them, null for the rest.
        "reason": data.get("message") if content else None,
        "answer": data.get("value") if content and has_value else None,
        "has_answer": has_value,
        # An approval of arguments the person edited: that it was edited is for everyone, both
        # calls' arguments (the run's words) for content readers only.
        "edited": bool(data.get("edited")) if verb == "approve" else False,
        "original_args": data.get("original_args") if content and data.get("edited") else None,
        "args": data.get("args") if content and data.get("edited") else None,
        "note": note(verb, data),
    }


def note(verb: str, data: dict[str, Any]) -> str | None:
    """What an entry says beyond its verb, in words of the platform's only (never the run's): whose
    a call became, who was reminded or told, an approval's place among two."""
    if verb == "assign":
        two = " (two approvers for a call with effects)" if data.get("two_approvers") else ""
        return f"assigned to {', '.join(f'group {g}' for g in data.get('groups') or [])}{two}"
    if verb in ("remind", "escalate"):
        waited = int(data.get("waited_seconds") or 0)
        told = ", ".join(data.get("to") or [])
        people = int(data.get("notified") or 0)
        what = "reminded" if verb == "remind" else "escalated to"
        return (
            f"{data.get('kind', 'wait')} waiting {waited // 60} min, owned by {', '.join(data.get('owners') or [])}: "
            f"{what} {told} ({people} {'person' if people == 1 else 'people'})"
        )
    if verb == "approve" and data.get("of") == 2:
        if data.get("approval") == 1:
            return "first of two approvals: the call waits for a second approver"
        return f"second of two approvals (the first by {data.get('first_by')})"
    return None


def all_entries(user: Any, workspace: Workspace, filters: dict[str, Any], *, chunk: int = MAX_LIMIT) -> Iterator[dict[str, Any]]:
    """Every entry the filters select, newest first, read a page at a time (no long transaction)."""
    cursor: str | None = None
    while True:
        page = audit_page(user, workspace, filters, cursor=cursor, limit=chunk)
        yield from page["items"]
        cursor = page["next"]
        if cursor is None:
            return


def csv_cell(value: Any) -> str:
    """A cell's text, with anything a spreadsheet would run as a formula made plain text."""
    if value is None:
        text = ""
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def csv_row(entry: dict[str, Any]) -> list[str]:
    values = {
        **entry,
        "tasks": " ".join(entry["tasks"]) if entry["tasks"] else None,
        "answer": entry["answer"] if entry["has_answer"] and entry["content_visible"] else None,
    }
    return [csv_cell(values[column]) for column in CSV_COLUMNS]
