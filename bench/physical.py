"""The physical limit: what the database and the broker can do at all, on this machine, right now.

- `update_rate`: single-row `UPDATE bench_counter SET n = n + 1 WHERE id = %s` commits per second,
  autocommit, with as many connections (one process each) as the Celery workers use; each
  connection updates a row of its own, so the figure is commit throughput, not lock contention.
- `pgbench_rate`: `pgbench -N` (the simple-update script) with as many clients, where pgbench is installed.
- `redis_rate`: Redis round trips per second (PING) over one connection.
"""

from __future__ import annotations

import multiprocessing
import re
import shutil
import subprocess
import time
from typing import Any

from bench.harness import WORKER_PROCESSES


def _update_loop(url: str, row: int, ready: Any, go: Any, seconds: float, out: Any) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO bench_counter (id, n) VALUES (%s, 0) ON CONFLICT (id) DO NOTHING", (row,))
        ready.release()
        go.wait()
        count = 0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            conn.execute("UPDATE bench_counter SET n = n + 1 WHERE id = %s", (row,), prepare=True)
            count += 1
        out.put(count)


def update_rate(url: str, seconds: float, connections: int = WORKER_PROCESSES) -> float:
    """Single-row UPDATE commits per second over `connections` connections, each in its own process."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_counter (id integer PRIMARY KEY, n bigint NOT NULL DEFAULT 0)")
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Semaphore(0)
    go = ctx.Event()
    out = ctx.Queue()
    procs = [ctx.Process(target=_update_loop, args=(url, i + 1, ready, go, seconds, out)) for i in range(connections)]
    for proc in procs:
        proc.start()
    for _ in procs:
        if not ready.acquire(timeout=60):
            raise RuntimeError("bench: an UPDATE-loop process did not start")
    go.set()
    total = sum(out.get(timeout=seconds + 60) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
    return total / seconds


def pgbench_available() -> bool:
    return shutil.which("pgbench") is not None


def pgbench_init(url: str) -> None:
    subprocess.run(["pgbench", "-i", "-q", "-s", "1", url], check=True, capture_output=True, timeout=300)


def pgbench_rate(url: str, seconds: float, clients: int = WORKER_PROCESSES) -> float:
    """`pgbench -N` transactions per second (each: one UPDATE, one SELECT, one INSERT)."""
    done = subprocess.run(
        ["pgbench", "-N", "-n", "-M", "prepared", "-c", str(clients), "-j", str(clients), "-T", str(max(1, round(seconds))), url],
        check=True,
        capture_output=True,
        text=True,
        timeout=seconds + 120,
    )
    match = re.search(r"tps = ([0-9.]+)", done.stdout)
    if match is None:
        raise RuntimeError(f"bench: cannot read pgbench's output:\n{done.stdout}\n{done.stderr}")
    return float(match.group(1))


def redis_rate(redis_url: str, seconds: float) -> float:
    """PING round trips per second over one connection."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        client.ping()
        count = 0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            client.ping()
            count += 1
        return count / seconds
    finally:
        client.close()
