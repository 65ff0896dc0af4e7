"""Presentation helpers for the console's templates: durations, JSON, the task graph.

Everything returned here is plain text or numbers; the templates escape it (agent
words never pass through `mark_safe`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone
from django.utils.dateparse import parse_datetime

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
        nodes.append(
            {
                "key": key,
                "label": key if len(key) <= LABEL_CHARS else key[: LABEL_CHARS - 1] + "…",
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
