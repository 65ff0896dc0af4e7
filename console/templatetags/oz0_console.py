"""Presentation helpers for the console's templates: durations, JSON, the task graph.

Everything returned here is plain text or numbers; the templates escape it (agent
words never pass through `mark_safe`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from django import template
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from runs.permissions import behind_a_wall

register = template.Library()


@register.filter
def duration(seconds: Any) -> str:
    """12s, 3m 04s, 5h 02m, 2d 3h."""
    try:
        total = max(0, int(seconds))
    except (TypeError, ValueError):
        return ""
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


@register.filter
def seconds(value: Any) -> str:
    """A task's duration: 0.42s, 7.3s, then as `duration` from a minute up."""
    try:
        total = max(0.0, float(value))
    except (TypeError, ValueError):
        return ""
    if total < 10:
        return f"{total:.2f}s"
    if total < 60:
        return f"{total:.1f}s"
    return duration(total)


@register.filter
def since(value: Any) -> str:
    """How long ago an ISO timestamp or datetime was, as a duration."""
    moment = _as_datetime(value)
    if moment is None:
        return ""
    return duration((timezone.now() - moment).total_seconds())


def _as_datetime(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        return parse_datetime(value)
    return None


@register.filter
def as_datetime(value: Any) -> datetime | None:
    return _as_datetime(value)


@register.filter
def capped(value: Any, cap: int = 1000) -> str:
    """A count shown as "1000+" once it reaches the cap it was counted to."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        return ""
    return f"{cap}+" if number >= cap else str(number)


@register.filter
def pretty_json(value: Any) -> str:
    """Indented JSON text (escaped by the template like any other text)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        return str(value)


TEXT_SHOWN = 20_000


@register.filter
def capped_text(value: Any) -> str:
    """Long text (a result, a provider call) cut to its first TEXT_SHOWN characters, saying so."""
    text = str(value)
    return text if len(text) <= TEXT_SHOWN else f"{text[:TEXT_SHOWN]}\n… {len(text) - TEXT_SHOWN} more characters"


@register.filter
def compact_json(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        return str(value)


@register.filter
def words(value: Any) -> str:
    """underscore_words → underscore words (kinds, reasons, statuses)."""
    return str(value or "").replace("_", " ")


@register.filter
def dom_id(value: Any) -> str:
    """A task key as an id fragment, one-to-one (slugify would make r1.1 and r11 the same)."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "-_") else f"_{ord(c):x}_" for c in str(value))


@register.filter
def short_id(value: Any) -> str:
    return str(value)[:8]


@register.filter
def get(mapping: Any, key: Any) -> Any:
    if isinstance(mapping, Mapping):
        return mapping.get(key)
    return None


# ---- the task graph, laid out by depth of the `after` DAG ----

NODE_W = 150
NODE_H = 34
COL_GAP = 60
ROW_GAP = 16
PAD = 12
LABEL_CHARS = 18


def graph_layout(tasks: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Columns by depth (a task sits one column right of its deepest source), rows in
    task order within a column; edges as cubic curves from source to consumer."""
    rows = list(tasks)
    by_key = {t["key"]: t for t in rows}
    depth: dict[str, int] = {}
    for task in rows:  # tasks come in position order; sources precede consumers, but be safe
        _depth(task["key"], by_key, depth, set())
    columns: dict[int, list[str]] = {}
    for task in rows:
        columns.setdefault(depth[task["key"]], []).append(task["key"])
    place: dict[str, tuple[int, int]] = {}
    for col, keys in columns.items():
        for row, key in enumerate(keys):
            place[key] = (PAD + col * (NODE_W + COL_GAP), PAD + row * (NODE_H + ROW_GAP))
    nodes = []
    for task in rows:
        x, y = place[task["key"]]
        key = str(task["key"])
        label = str(task.get("label") or key)  # a fan-out group's node is labelled by its stem and size
        nodes.append(
            {
                "key": key,
                "label": label if len(label) <= LABEL_CHARS else label[: LABEL_CHARS - 1] + "…",
                "status": task["status"],
                "kind": task["kind"],
                # A delegate node carries its child run's status (F14): the parent waits on it.
                "child_status": (task.get("child") or {}).get("status"),
                "x": x,
                "y": y,
                "tx": x + 10,
                "ty": y + NODE_H / 2 + 1,
                "sx": x + NODE_W - 10,
            }
        )
    edges = []
    for task in rows:
        for source in task.get("after") or []:
            if source not in place:
                continue
            sx, sy = place[source]
            tx, ty = place[task["key"]]
            x1, y1, x2, y2 = sx + NODE_W, sy + NODE_H / 2, tx, ty + NODE_H / 2
            mid = (x1 + x2) / 2
            edges.append({"d": f"M{x1},{y1} C{mid},{y1} {mid},{y2} {x2},{y2}", "status": by_key[source]["status"]})
    width = PAD * 2 + (max(columns) + 1) * NODE_W + max(columns) * COL_GAP if columns else 0
    height = PAD * 2 + max(len(k) for k in columns.values()) * (NODE_H + ROW_GAP) - ROW_GAP if columns else 0
    return {"nodes": nodes, "edges": edges, "width": width, "height": height, "node_w": NODE_W, "node_h": NODE_H}


def _depth(key: str, by_key: Mapping[str, Mapping[str, Any]], depth: dict[str, int], seen: set[str]) -> int:
    if key in depth:
        return depth[key]
    if key in seen or key not in by_key:
        return 0  # an unknown source or a (rejected-on-create) cycle: stay in the first column
    seen.add(key)
    sources = [s for s in by_key[key].get("after") or [] if s in by_key]
    depth[key] = 1 + max((_depth(s, by_key, depth, seen) for s in sources), default=-1)
    return depth[key]


@register.simple_tag
def task_graph(tasks: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    return graph_layout(tasks)


def _local(value: Any) -> datetime | None:
    moment = _as_datetime(value)
    if moment is None:
        return None
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment, UTC)
    return timezone.localtime(moment)


@register.filter
def abs_time(value: Any) -> str:
    """An instant in full, in the person's time zone (their settings; UTC by default), with the
    zone: what hovering a relative time ("3m ago") shows. "" for what is not a time."""
    local = _local(value)
    return f"{local:%Y-%m-%d %H:%M:%S} {local.tzname() or ''}".rstrip() if local else ""


@register.filter
def trace_time(value: Any) -> str:
    """A trace event's instant to the millisecond, with its date and zone (issue 30.8)."""
    local = _local(value)
    return f"{local:%Y-%m-%d %H:%M:%S}.{local.microsecond // 1000:03d} {local.tzname() or ''}".rstrip() if local else ""


@register.filter
def iso_time(value: Any) -> str:
    """An instant (a datetime or an ISO text) as ISO 8601 with its offset, for `<time datetime>`."""
    local = _local(value)
    return local.isoformat() if local else ""


@register.simple_tag(takes_context=True)
def hidden_why(context: Mapping[str, Any], subject: Any = None, walled: Any = None) -> str:
    """Why a run's words are hidden from the person reading (issue 30.8): someone else's private
    run ("hidden: a private run of alice") told apart from their role ("hidden from your role").
    `subject`: a Run, or the name an item carries as `private_of`."""
    owner = subject if isinstance(subject, str) else None
    if subject is not None and not isinstance(subject, str) and getattr(subject, "private", False):
        user = context.get("user")
        if getattr(subject, "created_by_id", None) != getattr(user, "pk", None):
            creator = getattr(subject, "created_by", None)
            owner = getattr(creator, "username", None) or "its creator"
    if owner:
        return f"hidden: this is a private run of {owner}, whose words its creator alone reads"
    if subject is not None and not isinstance(subject, str) and not walled:
        user = context.get("user")
        walled = subject.agent_name if user is not None and behind_a_wall(user, subject) else None
    if walled:
        return f"hidden: a wall around {walled} closes its runs' words to you"
    return "hidden from your role"
