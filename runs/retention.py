"""Retention: a finished run's trace (the audit trail is its verb rows) and findings older than
their workspace's retention are deleted, in bounded batches (beat's `Pruner`, `./oz0 manage prune`).

A workspace keeps them `retention_days` (null: the installer's OZ0_RETENTION_DAYS; 0: for ever).
The trace of a run still open (any status but completed or canceled) is never pruned, whatever
its age: a held run's history is what its repair reads. Findings of an open run stay too.

How the trace is walked (the measure in docs/retention.md chose it over time partitions): the
newest id older than the latest cutoff is found by a binary search over the primary key (ids are
handed out in time order, up to a transaction's length, and the delete itself re-checks `at`), so
the hottest table needs no index on its time. Then the ids up to it are deleted in windows of
OZ0_PRUNE_BATCH ids, one short transaction each: a window deletes at most that many rows and
reads at most that many index entries, so no statement holds locks or builds WAL for long.
Findings have an index on `created_at`: their batches are the oldest OZ0_PRUNE_BATCH rows.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from runs.models import RUN_FINISHED
from tenancy.models import Workspace

log = logging.getLogger(__name__)

FINISHED = [str(status) for status in RUN_FINISHED]


@dataclass
class Pruned:
    trace: int = 0
    findings: int = 0
    batches: int = 0
    seconds: float = 0.0
    # The longest one statement took: what a batch holds its locks and the WAL writer for.
    slowest_batch: float = 0.0

    def timed(self, started: float) -> None:
        self.batches += 1
        self.slowest_batch = max(self.slowest_batch, time.monotonic() - started)


def retention_days(workspace: Workspace) -> int:
    """The days a workspace keeps what it prunes (0: for ever)."""
    if workspace.retention_days is not None:
        return int(workspace.retention_days)
    return int(settings.OZ0_RETENTION_DAYS)


def cutoffs(now: datetime) -> dict[int, datetime]:
    """Each workspace that prunes, with the time before which its rows go."""
    default = int(settings.OZ0_RETENTION_DAYS)
    found: dict[int, datetime] = {}
    for pk, days in Workspace.objects.values_list("pk", "retention_days"):
        keep = default if days is None else int(days)
        if keep > 0:
            found[pk] = now - timedelta(days=keep)
    return found


def _first_at_or_after(cursor: Any, pk: int) -> tuple[int, datetime] | None:
    cursor.execute("SELECT id, at FROM runs_traceevent WHERE id >= %s ORDER BY id LIMIT 1", [pk])
    row = cursor.fetchone()
    return None if row is None else (int(row[0]), row[1])


def trace_bounds(cursor: Any, before: datetime) -> tuple[int, int] | None:
    """(the lowest trace id, the highest id whose event is older than `before`), or None when the
    oldest event is not: a binary search over the primary key, some 30 index probes at most."""
    cursor.execute("SELECT min(id), max(id) FROM runs_traceevent")
    low_id, high_id = cursor.fetchone()
    if low_id is None:
        return None
    first = _first_at_or_after(cursor, low_id)
    if first is None or first[1] >= before:
        return None
    low, high = int(low_id), int(high_id)
    while low < high:
        middle = (low + high + 1) // 2
        row = _first_at_or_after(cursor, middle)
        if row is not None and row[1] < before:
            low = row[0]
        else:
            high = middle - 1
    return int(low_id), low


# The window's runs are found first (a few dozen: a run's events lie close together) and looked up
# by their primary key; joined directly, the planner hashed every finished run of the store for
# each window (measured: a sequential scan of runs_run per window, most of a pass's time).
TRACE_WINDOW = """
WITH window_runs AS (
  SELECT DISTINCT run_id FROM runs_traceevent WHERE id > %(after)s AND id <= %(until)s
), prunable AS (
  SELECT r.id, c.cutoff
  FROM window_runs w
  JOIN runs_run AS r ON r.id = w.run_id
  JOIN unnest(%(workspaces)s::bigint[], %(cutoffs)s::timestamptz[]) AS c(workspace_id, cutoff) ON c.workspace_id = r.workspace_id
  WHERE r.status = ANY(%(finished)s)
)
DELETE FROM runs_traceevent AS t USING prunable AS p
WHERE t.id > %(after)s AND t.id <= %(until)s AND t.run_id = p.id AND t.at < p.cutoff
"""

FINDINGS_BATCH = """
DELETE FROM runs_finding WHERE id IN (
  SELECT f.id FROM runs_finding AS f
  WHERE f.workspace_id = %(workspace)s AND f.created_at < %(cutoff)s
    AND NOT EXISTS (SELECT 1 FROM runs_run AS r WHERE r.id = f.run_id AND NOT (r.status = ANY(%(finished)s)))
  ORDER BY f.created_at LIMIT %(batch)s
)
"""


def prune_trace(found: dict[int, datetime], batch: int, pruned: Pruned) -> None:
    if not found:
        return
    with connection.cursor() as cursor:
        bounds = trace_bounds(cursor, max(found.values()))
        if bounds is None:
            return
        after, last = bounds[0] - 1, bounds[1]
        params: dict[str, Any] = {"workspaces": list(found), "cutoffs": list(found.values()), "finished": FINISHED}
        while after < last:
            until = min(after + batch, last)
            started = time.monotonic()
            cursor.execute(TRACE_WINDOW, {**params, "after": after, "until": until})
            pruned.trace += max(cursor.rowcount, 0)
            pruned.timed(started)
            after = until


def prune_findings(found: dict[int, datetime], batch: int, pruned: Pruned) -> None:
    with connection.cursor() as cursor:
        for workspace, cutoff in found.items():
            while True:
                started = time.monotonic()
                cursor.execute(FINDINGS_BATCH, {"workspace": workspace, "cutoff": cutoff, "finished": FINISHED, "batch": batch})
                deleted = max(cursor.rowcount, 0)
                pruned.findings += deleted
                pruned.timed(started)
                if deleted < batch:
                    break


def prune(*, now: datetime | None = None, batch: int | None = None) -> Pruned:
    """One pass over every workspace that prunes. Each statement commits on its own (call it
    outside a transaction): a pass that stops half-way has kept what it deleted."""
    started = time.monotonic()
    size = int(batch if batch is not None else settings.OZ0_PRUNE_BATCH)
    if size <= 0:
        raise ValueError("the prune batch must be a positive number of rows")
    found = cutoffs(now or timezone.now())
    pruned = Pruned()
    prune_trace(found, size, pruned)
    prune_findings(found, size, pruned)
    pruned.seconds = time.monotonic() - started
    if pruned.trace or pruned.findings:
        log.info(
            "pruned %d trace events and %d findings in %d batches (%.1fs)",
            pruned.trace,
            pruned.findings,
            pruned.batches,
            pruned.seconds,
        )
    return pruned
