"""`prune`: retention's batched deletes over tens of millions of trace rows, and time partitions beside them.

`python -m bench.prune [ROWS]` (default 10,000,000; OZ0_PRUNE_ROWS too):

1. creates a scratch database `bench_prune_<pid>` beside DATABASE_URL's and migrates it;
2. loads ROWS trace events (100 per run, `at` rising with the id over 365 days, as the kernel
   writes them) with `INSERT ... SELECT generate_series` in chunks, into three workspaces that
   keep 180 days, for ever and 30 days; one run in 20 is still open (held), so its trace stays;
   and ROWS/30 findings; then VACUUM ANALYZE;
3. times `runs.retention.prune` (the very code beat runs): rows deleted per second, batches,
   the slowest batch (what one statement holds locks for), and a second pass with nothing left
   to delete (what the hourly pass costs in steady state);
4. the other design: the trace of the oldest 60 days copied into a table partitioned by month,
   then what dropping an expired month costs when the open runs' rows must be kept (moved out
   first) -- timed the same way;
5. drops the scratch database.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
PER_RUN = 100
CHUNK = 1_000_000
DAYS = 365
OPEN_EVERY = 20
RETENTION = {1: 180, 2: 0, 3: 30}  # workspace id -> days (0: for ever)


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


def _scalar(conn: Any, sql: str) -> int:
    return int(conn.execute(sql).fetchone()[0])


def _load(conn: Any, rows: int, now: datetime) -> dict[str, float]:
    timings: dict[str, float] = {}
    start = now - timedelta(days=DAYS)
    step = timedelta(days=DAYS) / rows
    runs = (rows + PER_RUN - 1) // PER_RUN
    started = time.perf_counter()
    for ws, days in RETENTION.items():
        conn.execute(
            "INSERT INTO runs_workspace (id, slug, name, created_at, stored_input_bytes, retention_days) "
            "VALUES (%s, %s, '', now(), 0, %s)",
            [ws, f"prune-{ws}", days],
        )
    conn.execute(
        """
        INSERT INTO runs_run (id, workspace_id, agent_name, private, status, deliverable, announcements, approval, retry_budget,
                              last_seq, created_at, updated_at, depth, parent_task_key, tainted)
        SELECT md5(r::text)::uuid, 1 + (r %% 3), 'agent', false,
               CASE WHEN r %% %(open)s = 0 THEN 'needs_attention' ELSE 'completed' END, '', '{}', '{}', 0, %(per)s,
               %(start)s + r * %(per)s * %(step)s, %(start)s + r * %(per)s * %(step)s, 0, '', false
        FROM generate_series(0, %(runs)s - 1) AS r
        """,
        {"open": OPEN_EVERY, "per": PER_RUN, "start": start, "step": step, "runs": runs},
    )
    timings["load_runs_s"] = round(time.perf_counter() - started, 2)
    started = time.perf_counter()
    done = 0
    while done < rows:
        last = min(done + CHUNK, rows) - 1
        conn.execute(
            """
            INSERT INTO runs_traceevent (run_id, seq, at, task_key, event, from_status, to_status, actor, data)
            SELECT md5((i / %(per)s)::text)::uuid, 1 + i %% %(per)s, %(start)s + i * %(step)s, 'k' || (i %% 7),
                   CASE WHEN i %% 50 = 0 THEN 'verb' ELSE 'status' END, 'waiting', 'running', 'bench',
                   '{"kind": "tool", "verb": "approve"}'::jsonb
            FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i
            """,
            {"per": PER_RUN, "start": start, "step": step, "first": done, "last": last},
        )
        done = last + 1
        print(f"bench.prune: {done:,} trace rows loaded ({time.perf_counter() - started:.0f}s)", file=sys.stderr)
    timings["load_trace_s"] = round(time.perf_counter() - started, 2)
    started = time.perf_counter()
    conn.execute(
        """
        INSERT INTO runs_finding (run_id, workspace_id, agent_name, agent_version, kind, retryable, partial, person, declared,
                                  step_key, step_kind, error_key, attempts, created_at)
        SELECT md5(r::text)::uuid, 1 + (r %% 3), 'agent', 1, 'timeout', true, false, false, false, 'k', 'tool', '', 1,
               %(start)s + r * %(per)s * %(step)s
        FROM generate_series(0, %(runs)s - 1) AS r, generate_series(1, 3) AS n
        """,
        {"per": PER_RUN, "start": start, "step": step, "runs": runs},
    )
    timings["load_findings_s"] = round(time.perf_counter() - started, 2)
    started = time.perf_counter()
    conn.execute("VACUUM ANALYZE")
    timings["vacuum_s"] = round(time.perf_counter() - started, 2)
    return timings


def _expected(conn: Any, now: datetime) -> dict[str, int]:
    """What retention must delete, counted independently of runs/retention.py."""
    trace = conn.execute(
        """
        SELECT count(*) FROM runs_traceevent t JOIN runs_run r ON r.id = t.run_id JOIN runs_workspace w ON w.id = r.workspace_id
        WHERE w.retention_days > 0 AND t.at < %s - make_interval(days => w.retention_days) AND r.status = 'completed'
        """,
        [now],
    ).fetchone()[0]
    findings = conn.execute(
        """
        SELECT count(*) FROM runs_finding f JOIN runs_workspace w ON w.id = f.workspace_id JOIN runs_run r ON r.id = f.run_id
        WHERE w.retention_days > 0 AND f.created_at < %s - make_interval(days => w.retention_days) AND r.status = 'completed'
        """,
        [now],
    ).fetchone()[0]
    return {"trace": int(trace), "findings": int(findings)}


def _partitions(conn: Any, now: datetime) -> dict[str, Any]:
    """The oldest 60 days' trace in a table partitioned by month: what an expired month's drop costs."""
    start = now - timedelta(days=DAYS)
    middle, end = start + timedelta(days=30), start + timedelta(days=60)
    conn.execute("CREATE TABLE trace_by_month (LIKE runs_traceevent INCLUDING DEFAULTS) PARTITION BY RANGE (at)")
    first = (start - timedelta(days=1)).isoformat()
    conn.execute(
        f"CREATE TABLE trace_month_1 PARTITION OF trace_by_month FOR VALUES FROM ('{first}') TO ('{middle.isoformat()}')"
    )
    conn.execute(
        f"CREATE TABLE trace_month_2 PARTITION OF trace_by_month FOR VALUES FROM ('{middle.isoformat()}') TO ('{end.isoformat()}')"
    )
    conn.execute("CREATE TABLE trace_kept (LIKE runs_traceevent INCLUDING DEFAULTS)")
    conn.execute("INSERT INTO trace_by_month SELECT * FROM runs_traceevent WHERE at < %s", [end])
    conn.execute("CREATE UNIQUE INDEX ON trace_by_month (run_id, seq, at)")
    conn.execute("CREATE INDEX ON trace_by_month (run_id, task_key, seq)")
    conn.execute("VACUUM ANALYZE trace_by_month")
    rows = conn.execute("SELECT count(*) FROM trace_month_1").fetchone()[0]
    started = time.perf_counter()
    with conn.transaction():
        # The open runs' rows (and, with retentions per workspace, every longer-keeping
        # workspace's) must leave the month before it can go.
        moved = conn.execute(
            "INSERT INTO trace_kept SELECT t.* FROM trace_month_1 t JOIN runs_run r ON r.id = t.run_id "
            "WHERE r.status <> 'completed' OR r.workspace_id = 2"
        ).rowcount
        conn.execute("ALTER TABLE trace_by_month DETACH PARTITION trace_month_1")
        conn.execute("DROP TABLE trace_month_1")
    seconds = time.perf_counter() - started
    return {
        "month_rows": int(rows),
        "kept_rows_moved": int(moved),
        "dropped_rows": int(rows) - int(moved),
        "move_and_drop_s": round(seconds, 3),
        "rows_per_s": round((int(rows) - int(moved)) / seconds) if seconds else None,
    }


def run(rows: int) -> dict[str, Any]:
    import psycopg

    base = os.environ.get("DATABASE_URL", "")
    if not base:
        raise SystemExit("bench.prune: DATABASE_URL is not set")
    scratch = f"bench_prune_{os.getpid()}"
    scratch_url = _with_database(base, scratch)
    with psycopg.connect(_with_database(base, "postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{scratch}"')
        admin.execute(f'CREATE DATABASE "{scratch}"')
    try:
        env = {**os.environ, "DATABASE_URL": scratch_url, "DJANGO_SETTINGS_MODULE": "oz0site.settings"}
        subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "--verbosity", "0"], cwd=ROOT, env=env, check=True)
        now = datetime.now(UTC)
        with psycopg.connect(scratch_url, autocommit=True) as conn:
            timings = _load(conn, rows, now)
            expected = _expected(conn, now)
            size = _scalar(conn, "SELECT pg_total_relation_size('runs_traceevent')")
            partitions = _partitions(conn, now) if os.environ.get("OZ0_PRUNE_PARTITIONS", "1") == "1" else None
        os.environ["DATABASE_URL"] = scratch_url
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "oz0site.settings")
        import django

        django.setup()
        from runs import retention

        first = retention.prune(now=now)
        second = retention.prune(now=now)
        with psycopg.connect(scratch_url, autocommit=True) as conn:
            left = _expected(conn, now)
            kept_open = _scalar(
                conn, "SELECT count(*) FROM runs_traceevent t JOIN runs_run r ON r.id = t.run_id WHERE r.status <> 'completed'"
            )
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(_with_database(base, "postgres"), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')
    return {
        "trace_rows": rows,
        "trace_table_bytes": int(size),
        **timings,
        "expected": expected,
        "left_after_prune": left,
        "kept_open_run_rows": int(kept_open),
        "batch_size": int(os.environ.get("OZ0_PRUNE_BATCH", "5000")),
        "first_pass": {
            "trace_deleted": first.trace,
            "findings_deleted": first.findings,
            "batches": first.batches,
            "seconds": round(first.seconds, 2),
            "trace_rows_per_s": round(first.trace / first.seconds) if first.seconds else None,
            "slowest_batch_ms": round(first.slowest_batch * 1000, 1),
        },
        "second_pass": {
            "deleted": second.trace + second.findings,
            "batches": second.batches,
            "seconds": round(second.seconds, 2),
            "slowest_batch_ms": round(second.slowest_batch * 1000, 1),
        },
        "partitions": partitions,
    }


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else int(os.environ.get("OZ0_PRUNE_ROWS", "10000000"))
    print(json.dumps(run(count), indent=2))
