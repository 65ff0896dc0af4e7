"""The repair candidates of runs (S15, S16), read from their traces by graph's one rule: the only
place that turns trace rows into what `graph.repair_candidates` reads."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from runs.kernel.graph import REPLAYED_EVENTS, repair_candidates
from runs.models import TraceEvent


def repair_candidates_of(run_ids: Iterable[Any]) -> dict[Any, list[str]]:
    """Each run's retry/abandon candidates (an empty list for a run with none), in one query."""
    ids = list(run_ids)
    traces: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    # Only the events `replay` reads: a run's provider calls (most of a long trace's bytes) never.
    rows = (
        TraceEvent.objects.filter(run_id__in=ids, event__in=REPLAYED_EVENTS)
        .order_by("run_id", "seq")
        .values_list("run_id", "task_key", "event", "to_status", "error", "data")
    )
    for run_id, key, event, to, error, data in rows:
        traces[run_id].append({"task": key, "event": event, "to": to, "error": error, "data": data})
    return {run_id: repair_candidates(traces[run_id]) for run_id in ids}
