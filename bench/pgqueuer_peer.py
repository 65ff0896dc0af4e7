"""A second Postgres job-queue peer: pgqueuer doing no-op jobs on the bench's own database.

pgqueuer is what a Python user picks for durable jobs on PostgreSQL with asyncio: jobs are rows,
workers take them with `FOR UPDATE SKIP LOCKED` in batches, LISTEN/NOTIFY wakes them, and a
finished job leaves the queue table for its log. Its workers are as many processes as oz0's
Celery workers (`python -m bench.pgqueuer_peer`: what `pgq run` does, on uvloop, with its
default batch of 10 and no concurrency cap; pgqueuer 1.6's own CLI fails on its log-level option
with this typer). The bench enqueues
the jobs in batches of 64 (as oz0's appends carry at most 64 tasks) under an entrypoint name of
its own, and the clock stops when none of them is left in the queue table.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from bench.harness import WORKER_PROCESSES, Processes, wait_until

BATCH = 64
ENTRYPOINT_ENV = "OZ0_BENCH_PGQUEUER_ENTRYPOINT"


@asynccontextmanager
async def create() -> AsyncIterator[Any]:
    """A worker's PgQueuer with the no-op entrypoint (a `pgq run` factory)."""
    import psycopg
    from pgqueuer import PgQueuer, PsycopgDriver

    connection = await psycopg.AsyncConnection.connect(os.environ["DATABASE_URL"], autocommit=True)
    queuer = PgQueuer(PsycopgDriver(connection))

    @queuer.entrypoint(os.environ[ENTRYPOINT_ENV])
    async def noop(job: Any) -> None:
        """Does nothing: the job's cost is the queue's own."""

    try:
        yield queuer
    finally:
        await connection.close()


async def _install(url: str) -> None:
    import psycopg
    from pgqueuer import PsycopgDriver, Queries

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as connection:
        queries = Queries(PsycopgDriver(connection))
        if not await queries.schema_is_installed():
            await queries.install()


def ensure_schema(url: str) -> None:
    asyncio.run(_install(url))


def start_workers(procs: Processes, entrypoint: str) -> None:
    for index in range(WORKER_PROCESSES):
        procs.spawn(
            f"pgqueuer-{index}",
            [sys.executable, "-m", "bench.pgqueuer_peer"],
            extra_env={ENTRYPOINT_ENV: entrypoint},
        )


async def _enqueue(url: str, entrypoint: str, n: int) -> None:
    import psycopg
    from pgqueuer import PsycopgDriver, Queries

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as connection:
        queries = Queries(PsycopgDriver(connection))
        for start in range(0, n, BATCH):
            size = min(BATCH, n - start)
            await queries.enqueue([entrypoint] * size, [None] * size, [0] * size)


def _left(conn: Any, entrypoint: str) -> int:
    row = conn.execute("SELECT count(*) FROM pgqueuer WHERE entrypoint = %s", (entrypoint,)).fetchone()
    return int(row[0]) if row else 0


def measure(n: int, entrypoint: str) -> dict[str, float]:
    import psycopg

    url = os.environ["DATABASE_URL"]
    started = time.time()
    asyncio.run(_enqueue(url, entrypoint, n))
    sent = time.time()
    with psycopg.connect(url, autocommit=True) as conn:
        wait_until(lambda: _left(conn, entrypoint) == 0, timeout=600, interval=0.01, what="pgqueuer's jobs to finish")
        finished = time.time()
    seconds = finished - started
    return {"seconds": seconds, "tasks_per_s": n / seconds, "send_seconds": sent - started}


async def _work() -> None:
    async with create() as queuer:
        await queuer.run()


if __name__ == "__main__":
    import uvloop

    uvloop.run(_work())
