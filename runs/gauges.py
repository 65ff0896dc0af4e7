"""The run store's state for /metrics, read at scrape time: ready tasks per workspace and queue
(the autoscaling signal), running calls and the session threads they hold, held runs, pending
approvals and the oldest one's age.

Each is one aggregate over an index that holds (or leads with) only the rows it counts: the
partial `task_queued`, `task_claimed` and `task_person` for tasks, `run_ws_status_recent`
(workspace, status) for held runs, probed once per workspace. A scrape reads the live work, never
the millions of settled tasks beside it (bench/metrics.py measures it at a million tasks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection

# A harnessed round (F7) goes to the session workers' queue; everything else to the default one.
SESSION_ROUND = "t.kind = 'round' AND av.manifest -> 'harness' ? 'kind'"

READY = f"""
SELECT w.slug, ({SESSION_ROUND}) AS session, count(*)
FROM runs_task t JOIN runs_run r ON r.id = t.run_id JOIN runs_workspace w ON w.id = r.workspace_id
LEFT JOIN runs_agentversion av ON av.id = r.agent_version_id
WHERE t.status = 'waiting' AND t.ready
GROUP BY 1, 2
"""

RUNNING = f"""
SELECT w.slug, ({SESSION_ROUND} AND t.status = 'running' AND t.claim IS NOT NULL) AS session, count(*)
FROM runs_task t JOIN runs_run r ON r.id = t.run_id JOIN runs_workspace w ON w.id = r.workspace_id
LEFT JOIN runs_agentversion av ON av.id = r.agent_version_id
WHERE t.status IN ('running', 'dispatched')
GROUP BY 1, 2
"""

HELD = """
SELECT w.slug, count(*) FROM runs_run r JOIN runs_workspace w ON w.id = r.workspace_id
WHERE r.status = 'needs_attention' GROUP BY 1
"""

APPROVALS = """
SELECT w.slug, count(*), min(t.queued_at)
FROM runs_task t JOIN runs_run r ON r.id = t.run_id JOIN runs_workspace w ON w.id = r.workspace_id
WHERE t.status = 'needs_approval' GROUP BY 1
"""

STATEMENTS = {"ready": READY, "running": RUNNING, "held": HELD, "approvals": APPROVALS}

Labels = tuple[tuple[str, str], ...]


@dataclass
class StoreGauges:
    ready: dict[Labels, float] = field(default_factory=dict)
    running: dict[Labels, float] = field(default_factory=dict)
    sessions: dict[Labels, float] = field(default_factory=dict)
    held: dict[Labels, float] = field(default_factory=dict)
    approvals: dict[Labels, float] = field(default_factory=dict)
    oldest_approval_age: dict[Labels, float] = field(default_factory=dict)


def _rows(sql: str) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return list(cursor.fetchall())


def store_gauges(now: datetime) -> StoreGauges:
    default_queue, session_queue = settings.CELERY_TASK_DEFAULT_QUEUE, settings.OZ0_SESSION_QUEUE
    gauges = StoreGauges()
    for slug, session, count in _rows(READY):
        labels = (("workspace", slug), ("queue", session_queue if session else default_queue))
        gauges.ready[labels] = gauges.ready.get(labels, 0) + count
    for slug, session, count in _rows(RUNNING):
        ws = (("workspace", slug),)
        gauges.running[ws] = gauges.running.get(ws, 0) + count
        if session:
            gauges.sessions[ws] = gauges.sessions.get(ws, 0) + count
    for slug, count in _rows(HELD):
        gauges.held[(("workspace", slug),)] = count
    for slug, count, oldest in _rows(APPROVALS):
        ws = (("workspace", slug),)
        gauges.approvals[ws] = count
        gauges.oldest_approval_age[ws] = max(0.0, (now - oldest).total_seconds()) if oldest is not None else 0.0
    return gauges
