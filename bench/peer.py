"""A Postgres job-queue peer: procrastinate doing no-op jobs on the bench's own database.

Its workers are as many processes as oz0's Celery workers (`procrastinate worker -c 1`, one
job at a time each, LISTEN/NOTIFY on). The bench defers the jobs in batches of 64 (as oz0's
appends carry at most 64 tasks) and the clock stops when none of the queue's jobs is left
`todo` or `doing`.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from procrastinate import App, PsycopgConnector

from bench.harness import WORKER_PROCESSES, Processes, wait_until

BATCH = 64

app = App(connector=PsycopgConnector(conninfo=os.environ.get("DATABASE_URL", "")))


@app.task(name="bench.noop")
def noop() -> None:
    """Does nothing: the job's cost is the queue's own."""


def ensure_schema(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        present = conn.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()
    if present and present[0]:
        return
    with app.open():
        app.schema_manager.apply_schema()


def start_workers(procs: Processes, queue: str) -> None:
    for index in range(WORKER_PROCESSES):
        procs.spawn(
            f"procrastinate-{index}",
            [sys.executable, "-m", "procrastinate", "--app=bench.peer.app", "worker", "-q", queue, "-c", "1"],
        )


def _left(conn: Any, queue: str) -> int:
    row = conn.execute(
        "SELECT count(*) FROM procrastinate_jobs WHERE queue_name = %s AND status IN ('todo', 'doing')", (queue,)
    ).fetchone()
    return int(row[0]) if row else 0


def measure(n: int, queue: str) -> dict[str, float]:
    import psycopg

    configured = noop.configure(queue=queue)
    with app.open():
        started = time.time()
        for start in range(0, n, BATCH):
            configured.batch_defer(*({} for _ in range(min(BATCH, n - start))))
        sent = time.time()
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        wait_until(lambda: _left(conn, queue) == 0, timeout=600, interval=0.01, what="procrastinate's jobs to finish")
        finished = time.time()
    seconds = finished - started
    return {"seconds": seconds, "tasks_per_s": n / seconds, "send_seconds": sent - started}
