"""`scorecard`: an agent's scorecard over 1,000,000 findings (50 agents x 5 versions), server time.

`run(quick)` (called by `./oz0 bench`, or `python -m bench.scorecard [--quick]` alone):

1. creates a scratch database `<DATABASE_URL's name>_scorecard` and migrates it (a
   subprocess `manage.py migrate`, so the real schema and the rollup triggers);
2. loads the findings with `INSERT ... SELECT generate_series` into `runs_finding` in
   batches of 100,000 — the statement-level trigger of insights keeps `insights_failuredaily`
   current exactly as it does for the kernel. The denominators (`insights_rundaily`: runs
   started per agent/version/workspace/day) and repairs (`insights_repairdaily`) are
   loaded straight into their rollups, a year of days each: loading the 10M runs and
   their traces behind them would take the bench longer than it is worth. So are a year of
   model usage (`insights_usagedaily`, two routes) and of run durations (`insights_durationdaily`,
   eight 10 % bins a day, and `insights_durationweekly`, their weekly sums);
3. VACUUM ANALYZEs (as autovacuum would soon after), then times `insights.selectors.scorecard_statements` — the very SQL the API
   runs — server-side with EXPLAIN (ANALYZE, TIMING OFF) (planning + execution, summed over
   the scorecard's statements, its top failure groups among them), and wall-clock through psycopg including building the document
   (`build_scorecard`); median, min and max of several repetitions, three shapes (all
   versions; one version; the last 30 days; the last year, whose counts and trend read a
   year of daily rows). Each shape's figure includes the scorecard page's range numbers
   (`insights.numbers.agent_statements`: runs, failures, usage and durations per version and
   bucket over the shape's window, else the longest range, 366 days in weeks; reported apart as
   `scorecard_<shape>_numbers_server`). The reference is a plain
   `SELECT count(*) FROM runs_finding` timed the same way; `ratio` = scorecard / count.
4. drops the scratch database.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
AGENTS = 50
VERSIONS = 5
WORKSPACES = 3
DAYS = 365
BATCH = 100_000
DECLARED = ("not_found", "tracker_busy", "bad_record")
# Message shapes per agent and kind, skewed so a few groups dominate: each finding's fingerprint
# is one of them (the trigger then keeps the failure groups, as for the kernel's writes).
SHAPES = 40
TARGET_MS = 100.0


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


def _setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "oz0site.settings")
    import django
    from django.apps import apps

    if not apps.ready:
        django.setup()


def _summary(values: list[float]) -> dict[str, Any]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "n": len(values),
        "unit": "ms",
    }


def _server_ms(conn: Any, sql: str, params: list[Any]) -> float:
    plan = conn.execute(f"EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) {sql}", params).fetchone()[0]
    top = plan[0] if isinstance(plan, list) else json.loads(plan)[0]
    return float(top["Planning Time"]) + float(top["Execution Time"])


def _load(conn: Any, findings: int) -> dict[str, float]:
    from runs.failures import PLATFORM_KINDS

    kinds = [*PLATFORM_KINDS, *DECLARED]
    timings: dict[str, float] = {}
    conn.execute("SELECT setseed(0.42)")
    started = time.perf_counter()
    done = 0
    while done < findings:
        size = min(BATCH, findings - done)
        # Kinds skewed toward the front of the list (a few kinds dominate, as in life).
        conn.execute(
            """
            INSERT INTO runs_finding (run_id, workspace_id, agent_name, agent_version, kind, retryable, partial, person,
                                      declared, step_key, step_kind, error_key, attempts, created_at, fingerprint)
            SELECT gen_random_uuid(), 1 + (i %% %(ws)s), agent, 1 + ((i / 3) %% %(versions)s), kind,
                   random() < 0.4, random() < 0.7, random() < 0.2, random() < 0.15,
                   'step-' || (i %% 9), CASE WHEN i %% 4 = 0 THEN 'tool' ELSE 'round' END, 'tool_failed', 1 + (i %% 3),
                   now() - random() * %(days)s * interval '1 day',
                   left(md5(agent || kind || floor(power(random(), 3) * %(shapes)s)::text), 32)
            FROM (SELECT i, 'agent-' || lpad(((i / 7) %% %(agents)s)::text, 2, '0') AS agent,
                         (%(kinds)s::text[])[1 + floor(power(random(), 2) * %(nkinds)s)::int] AS kind
                  FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i) AS f
            """,
            {
                "ws": WORKSPACES,
                "agents": AGENTS,
                "versions": VERSIONS,
                "kinds": kinds,
                "nkinds": len(kinds),
                "days": DAYS,
                "shapes": SHAPES,
                "first": done + 1,
                "last": done + size,
            },
        )
        done += size
    timings["load_findings_s"] = round(time.perf_counter() - started, 2)
    started = time.perf_counter()
    conn.execute(
        """
        INSERT INTO insights_rundaily (agent_name, agent_version, workspace_id, day, started)
        SELECT 'agent-' || lpad(a::text, 2, '0'), v, w, current_date - d, 20 + floor(random() * 40)::int
        FROM generate_series(0, %(agents)s - 1) a, generate_series(1, %(versions)s) v,
             generate_series(1, %(ws)s) w, generate_series(0, %(days)s - 1) d
        """,
        {"agents": AGENTS, "versions": VERSIONS, "ws": WORKSPACES, "days": DAYS},
    )
    conn.execute(
        """
        INSERT INTO insights_repairdaily (agent_name, agent_version, workspace_id, resolution, day, repairs, held, held_seconds,
                                          held_seconds_max)
        SELECT 'agent-' || lpad(a::text, 2, '0'), v, w, r, current_date - d, n, n, n * 600 * random(), 3600 * random()
        FROM generate_series(0, %(agents)s - 1) a, generate_series(1, %(versions)s) v, generate_series(1, %(ws)s) w,
             unnest(ARRAY['retried', 'abandoned']) r, generate_series(0, %(days)s - 1, 3) d,
             LATERAL (SELECT 1 + floor(random() * 4)::int AS n) k
        """,
        {"agents": AGENTS, "versions": VERSIONS, "ws": WORKSPACES, "days": DAYS},
    )
    # A manager's numbers (issue 31): a year of model usage (two routes) and of run durations (eight
    # 10 % bins between 10 s and 2 min) per agent/version/workspace/day, loaded straight into their rollups.
    conn.execute(
        """
        INSERT INTO insights_usagedaily (agent_name, agent_version, workspace_id, route, day, calls, input_tokens, output_tokens)
        SELECT 'agent-' || lpad(a::text, 2, '0'), v, w, r, current_date - d, c, c * 1800, c * 300
        FROM generate_series(0, %(agents)s - 1) a, generate_series(1, %(versions)s) v, generate_series(1, %(ws)s) w,
             unnest(ARRAY['openai:gpt-4o', 'anthropic:claude-sonnet-4-5']) r, generate_series(0, %(days)s - 1) d,
             LATERAL (SELECT 20 + floor(random() * 80)::int AS c) k
        """,
        {"agents": AGENTS, "versions": VERSIONS, "ws": WORKSPACES, "days": DAYS},
    )
    conn.execute(
        """
        INSERT INTO insights_durationdaily (agent_name, agent_version, workspace_id, day, bin, runs, seconds)
        SELECT 'agent-' || lpad(a::text, 2, '0'), v, w, current_date - d, 96 + b * 3 + floor(random() * 3)::int, n,
               n * power(1.1, 96 + b * 3) / 1000
        FROM generate_series(0, %(agents)s - 1) a, generate_series(1, %(versions)s) v, generate_series(1, %(ws)s) w,
             generate_series(0, %(days)s - 1) d, generate_series(0, 7) b,
             LATERAL (SELECT 1 + floor(random() * 8)::int AS n) k
        """,
        {"agents": AGENTS, "versions": VERSIONS, "ws": WORKSPACES, "days": DAYS},
    )
    conn.execute(
        "INSERT INTO insights_durationweekly (agent_name, agent_version, workspace_id, week, bin, runs, seconds) "
        "SELECT agent_name, agent_version, workspace_id, day - (((day - DATE '2000-01-03') % 7 + 7) % 7), bin, sum(runs), "
        "sum(seconds) FROM insights_durationdaily GROUP BY 1, 2, 3, 4, 5"
    )
    conn.execute(
        "INSERT INTO insights_runtotal (agent_name, agent_version, workspace_id, started) "
        "SELECT agent_name, agent_version, workspace_id, sum(started) FROM insights_rundaily GROUP BY 1, 2, 3"
    )
    conn.execute(
        "INSERT INTO insights_repairtotal (agent_name, agent_version, workspace_id, resolution, repairs, held, held_seconds, held_seconds_max) "
        "SELECT agent_name, agent_version, workspace_id, resolution, sum(repairs), sum(held), sum(held_seconds), max(held_seconds_max) "
        "FROM insights_repairdaily GROUP BY 1, 2, 3, 4"
    )
    timings["load_rollups_s"] = round(time.perf_counter() - started, 2)
    # What autovacuum does soon after a load (the migration tunes it for the rollups): the
    # visibility map lets the covering indexes answer with index-only scans.
    started = time.perf_counter()
    conn.execute("VACUUM ANALYZE")
    timings["vacuum_s"] = round(time.perf_counter() - started, 2)
    return timings


def _measure(conn: Any, reps: int) -> tuple[dict[str, Any], dict[str, Any]]:
    from insights.numbers import MAX_DAYS, Range, agent_statements, build_agent_numbers
    from insights.selectors import TREND_DAYS, build_scorecard, scorecard_statements

    today = datetime.now(UTC).date()
    trend_since = today - timedelta(days=TREND_DAYS - 1)
    workspace_ids = list(range(1, WORKSPACES + 1))
    shapes: dict[str, dict[str, Any]] = {
        "all_versions": {"agent": "agent-17", "version": None, "since": None},
        "one_version": {"agent": "agent-17", "version": 3, "since": None},
        "last_30_days": {"agent": "agent-17", "version": None, "since": trend_since},
        "last_year": {"agent": "agent-17", "version": None, "since": today - timedelta(days=DAYS)},
    }
    figures: dict[str, Any] = {}
    checks: dict[str, Any] = {}
    for name, shape in shapes.items():
        shape_trend = shape["since"] or trend_since
        statements = scorecard_statements(
            shape["agent"], shape["version"], shape["since"], None, workspace_ids=workspace_ids, trend_since=shape_trend
        )
        # The scorecard page's numbers in a range (insights.numbers): the shape's window, else the
        # longest range the page allows; weekly buckets beyond 45 days, as the page's default.
        since = shape["since"] or today - timedelta(days=MAX_DAYS - 1)
        period = Range(since, today, "day" if (today - since).days < 45 else "week", None)
        numbers = [
            (f"numbers_{key}", sql, params)
            for key, sql, params in agent_statements(
                shape["agent"], period, version=shape["version"], workspace_ids=workspace_ids
            )
        ]
        statements = [*statements, *numbers]
        for sql, params in ((s, p) for _, s, p in statements):  # warm the cache and the plans
            conn.execute(sql, params).fetchall()
        server, wall, groups_server, numbers_server = [], [], [], []
        per_statement: dict[str, list[float]] = {key: [] for key, _, _ in statements}
        card: dict[str, Any] = {}
        for _ in range(reps):
            each = {key: _server_ms(conn, sql, params) for key, sql, params in statements}
            for key, ms in each.items():
                per_statement[key].append(ms)
            server.append(sum(each.values()))
            groups_server.append(each["top_groups"])
            numbers_server.append(sum(ms for key, ms in each.items() if key.startswith("numbers_")))
            started = time.perf_counter()
            results = {key: conn.execute(sql, params).fetchall() for key, sql, params in statements}
            card = build_scorecard(shape["agent"], shape["version"], shape["since"], None, shape_trend, results, {})
            ranged = build_agent_numbers(
                period, {key[len("numbers_") :]: rows for key, rows in results.items() if key.startswith("numbers_")}
            )
            wall.append((time.perf_counter() - started) * 1000)
        figures[f"scorecard_{name}_server"] = _summary(server)
        figures[f"scorecard_{name}_wall"] = _summary(wall)
        figures[f"scorecard_{name}_top_groups_server"] = _summary(groups_server)  # part of the server figure
        figures[f"scorecard_{name}_numbers_server"] = _summary(numbers_server)  # part of the server figure
        # Where the time goes: each statement's median (parts of the server figure), and the plan
        # of the slowest one with its buffers (evidence for the next index or rollup).
        medians = {key: round(statistics.median(values), 3) for key, values in per_statement.items()}
        slowest = max(medians, key=lambda key: medians[key])
        sql, params = next((s, p) for k, s, p in statements if k == slowest)
        plan = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params).fetchall()
        checks[name] = {
            "runs": card.get("runs"),
            "failed": card.get("failed"),
            "kinds": len(card.get("by_kind", [])),
            "groups": len(card.get("groups", [])),
            "range_days": period.days,
            "range_buckets": len(ranged["trend"]),
            "range_runs": ranged["runs"],
            "range_p50_s": ranged["p50"],
            "range_p95_s": ranged["p95"],
            "range_cost_usd": ranged["cost_usd"],
            "statement_median_ms": medians,
            "slowest_statement": slowest,
            "slowest_plan": [row[0] for row in plan],
        }
    count_server = []
    for _ in range(reps):
        count_server.append(_server_ms(conn, "SELECT count(*) FROM runs_finding", []))
    figures["count_star_server"] = _summary(count_server)
    return figures, checks


def _insert_plan(conn: Any, sql: str, params: Any) -> tuple[float, float]:
    """(execution ms, trigger ms) of one INSERT, from EXPLAIN ANALYZE (which performs it)."""
    plan = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params).fetchone()[0]
    top = plan[0] if isinstance(plan, list) else json.loads(plan)[0]
    triggers = sum(
        float(t.get("Time", 0)) for t in top.get("Triggers", []) if str(t.get("Trigger Name", "")).startswith("insights_")
    )
    return float(top["Execution Time"]), triggers


def _trigger_overhead(conn: Any, n: int) -> dict[str, Any]:
    """What the triggers cost the kernel's writes: server time of single-row inserts (a finding,
    and a trace event that is not a repair) and the part of it spent in the insights triggers."""
    finding_sql = (
        "INSERT INTO runs_finding (run_id, workspace_id, agent_name, agent_version, kind, retryable, partial, person, declared, "
        "step_key, step_kind, error_key, attempts, created_at, fingerprint) "
        "VALUES (gen_random_uuid(), 1, 'agent-99', 1, 'timeout', true, true, false, false, 'r1', 'round', '', 1, now(), "
        "'0123456789abcdef0123456789abcdef')"
    )
    workspace = conn.execute(
        "INSERT INTO runs_workspace (slug, name, created_at) VALUES ('bench-trigger', '', now()) RETURNING id"
    ).fetchone()[0]
    run_id = conn.execute(
        "INSERT INTO runs_run (id, workspace_id, agent_name, private, status, deliverable, announcements, approval, retry_budget, "
        "last_seq, created_at, updated_at) VALUES (gen_random_uuid(), %s, 'agent-99', false, 'running', '', '{}', '{}', 0, 0, "
        "now(), now()) RETURNING id",
        [workspace],
    ).fetchone()[0]
    event_sql = (
        "INSERT INTO runs_traceevent (run_id, seq, at, task_key, event, from_status, to_status, actor, data) "
        "VALUES (%s, %s, now(), 'k', 'status', 'waiting', 'running', 'bench', '{\"kind\": \"tool\"}')"
    )
    figures: dict[str, Any] = {}
    seq = [0]

    def next_event() -> list[Any]:
        seq[0] += 1
        return [run_id, seq[0]]

    for label, sql, params in (("finding", finding_sql, lambda: None), ("trace_event", event_sql, next_event)):
        for _ in range(n // 10):  # warm up
            _insert_plan(conn, sql, params())
        timed = [_insert_plan(conn, sql, params()) for _ in range(n)]
        figures[label] = {
            "insert_ms": _summary([t[0] for t in timed]),
            "insights_trigger_ms": _summary([t[1] for t in timed]),
        }
    return figures


def run(quick: bool = False) -> dict[str, Any]:
    """Load the findings into a scratch database, time the scorecard, drop the database."""
    import psycopg

    _setup_django()
    base = os.environ.get("DATABASE_URL", "")
    if not base:
        raise SystemExit("bench.scorecard: DATABASE_URL is not set")
    scratch = f"{urlsplit(base).path.strip('/') or 'oz0'}_scorecard"
    scratch_url = _with_database(base, scratch)
    findings = (
        (200_000 if quick else 1_000_000)
        if not os.environ.get("OZ0_SCORECARD_FINDINGS")
        else int(os.environ["OZ0_SCORECARD_FINDINGS"])
    )
    reps = 7 if quick else 15
    with psycopg.connect(_with_database(base, "postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{scratch}"')
        admin.execute(f'CREATE DATABASE "{scratch}"')
    try:
        started = time.perf_counter()
        env = {**os.environ, "DATABASE_URL": scratch_url, "DJANGO_SETTINGS_MODULE": "oz0site.settings"}
        subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "--verbosity", "0"], cwd=ROOT, env=env, check=True)
        migrate_s = round(time.perf_counter() - started, 2)
        with psycopg.connect(scratch_url, autocommit=True) as conn:
            timings = _load(conn, findings)
            counted = conn.execute(
                "SELECT count(*), (SELECT sum(failed) FROM insights_failuredaily), (SELECT sum(failed) FROM insights_failuretotal) FROM runs_finding"
            ).fetchone()
            rollup_rows = conn.execute("SELECT count(*) FROM insights_failuredaily").fetchone()[0]
            group_rows = conn.execute("SELECT count(*), coalesce(sum(failed), 0) FROM insights_failuregroup").fetchone() or (0, 0)
            figures, checks = _measure(conn, reps)
            try:
                overhead: dict[str, Any] = _trigger_overhead(conn, 500 if quick else 2000)
            except psycopg.Error as error:  # the run store's columns moved: report, keep the figures
                overhead = {"skipped": f"{type(error).__name__}: {error}"}
    finally:
        with psycopg.connect(_with_database(base, "postgres"), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')
    worst = max(figures[f"scorecard_{s}_server"]["median"] for s in ("all_versions", "one_version", "last_30_days", "last_year"))
    count_ms = figures["count_star_server"]["median"]
    return {
        "figures": figures,
        "findings": findings,
        "agents": AGENTS,
        "versions": VERSIONS,
        "workspaces": WORKSPACES,
        "days": DAYS,
        "rollup_rows": rollup_rows,
        "rollup_matches_findings": counted[0] == counted[1] == counted[2],
        "failure_groups": group_rows[0],
        "groups_match_findings": group_rows[1] == counted[0],
        "checks": checks,
        "trigger_overhead_per_insert": overhead,
        "migrate_s": migrate_s,
        **timings,
        "scorecard_worst_median_server_ms": worst,
        "count_star_median_server_ms": count_ms,
        "ratio_scorecard_to_count": round(worst / count_ms, 4) if count_ms else None,
        "goal": f"scorecard server time < {TARGET_MS} ms at {findings:,} findings",
        "goal_met": worst < TARGET_MS,
        "notes": [
            f"{findings:,} findings loaded through runs_finding (the trigger kept the daily and total rollups: sums match = {counted[0] == counted[1] == counted[2]})",
            "run counts and repairs were loaded straight into their rollups (a year of days per agent/version/workspace)",
            "server time = EXPLAIN ANALYZE planning + execution summed over the scorecard's statements (five rollup reads and its top failure groups)",
            "and the range numbers (insights.numbers: runs, failures, usage and durations per version and bucket; "
            "the shape's window, else 366 days in weeks), loaded as a year of daily usage and duration-bin rows",
        ],
    }


if __name__ == "__main__":
    print(json.dumps(run("--quick" in sys.argv), indent=2))
