"""`fan`: one run of N no-op tool tasks (`test.echo`) built with appends, joined by one `all` join.

The bench builds it as a program would, through the JSON API over HTTP (a bearer token, one
kept-alive connection to a daphne the bench starts): the run is created with a client-authored
await (`gate`) that keeps it open while the bench appends the rest, 64 tasks per request; the
echo tasks start as soon as their append commits, and the gate is released with its token. The kernel caps a
join's `after` at 32 sources (`too_wide_a_fan`), so the one `all` join over N tasks is a tree
of `all` joins of at most 32 sources each (N=5,000: 157 + 5 + 1 joins); the top one, `all`,
is the deliverable. The clock runs from the create request to the run's `finished_at`.

Per-task costs come from the worker processes themselves (bench/probe.py) and from
pg_stat_database with the bench's own statements taken out.

Interleaved with it in every repetition (rotating the order): bare Celery no-ops, procrastinate
no-ops, pgqueuer no-ops, the single-row UPDATE commit rate, pgbench -N and the Redis round-trip rate.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bench import celery_bare, peer, pgqueuer_peer, physical
from bench.harness import (
    WORKER_PROCESSES,
    Environment,
    Processes,
    Profile,
    Section,
    goal_at_least,
    say,
    summary,
    wait_until,
)

APPEND_MAX = 64  # MAX_STEPS_PER_REQUEST
JOIN_MAX = 32  # MAX_FAN: a join waits on at most 32 sources


def join_tree(leaves: list[str], top: str = "all") -> list[dict[str, Any]]:
    """`all` joins over `leaves`, at most JOIN_MAX sources each, level by level up to one named `top`."""
    joins: list[dict[str, Any]] = []
    level, depth = list(leaves), 1
    while True:
        groups = [level[i : i + JOIN_MAX] for i in range(0, len(level), JOIN_MAX)]
        if len(groups) == 1:
            joins.append({"key": top, "kind": "join", "mode": "all", "after": groups[0]})
            return joins
        keys = []
        for index, group in enumerate(groups):
            key = f"j{depth}.{index}"
            joins.append({"key": key, "kind": "join", "mode": "all", "after": group})
            keys.append(key)
        level, depth = keys, depth + 1


class Client:
    """The bench as an API client: bearer token, one kept-alive HTTP connection to the bench's daphne."""

    def __init__(self, port: int, token: str) -> None:
        import httpx

        self.http = httpx.Client(
            base_url=f"http://127.0.0.1:{port}/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=120
        )
        self.requests = 0

    def post(self, path: str, body: dict[str, Any], expect: int = 200) -> dict[str, Any]:
        self.requests += 1
        response = self.http.post(path, json=body)
        if response.status_code != expect:
            raise RuntimeError(f"bench: POST {path} answered {response.status_code}: {response.text[:500]}")
        answer: dict[str, Any] = response.json()
        return answer

    def close(self) -> None:
        self.http.close()


def run_fan(n: int, workspace: Any, client: Client, probe_dir: Any) -> dict[str, float]:
    """Build one fan through the HTTP API and run it; returns its timings and per-task costs."""
    from bench import probe
    from bench.harness import QueryCounter
    from runs.models import Run, Task, TraceEvent

    echoes = [{"key": f"e{i}", "kind": "tool", "tool": "test.echo", "args": {"value": i}} for i in range(1, n + 1)]
    joins = join_tree([e["key"] for e in echoes])
    first = echoes[: APPEND_MAX - 1]
    rest = echoes[len(first) :] + joins
    # Everything the bench process itself runs on the database between the two snapshots (its
    # polling, its reads of the result) is counted here and taken out of pg_stat_database's figures.
    with QueryCounter() as own:
        sessions_before, commits_before = db_counters()
        workers_before = probe.snapshot(probe_dir)
        requests_before = client.requests
        started = time.time()
        created = client.post(
            f"/workspaces/{workspace.slug}/runs",
            {"tasks": [{"key": "gate", "kind": "await", "question": "hold the run open while it is built"}, *first]},
            expect=201,
        )
        run_id, gate_token = created["run"]["id"], created["receipt"]["tokens"]["gate"]
        for index in range(0, len(rest), APPEND_MAX):
            body: dict[str, Any] = {"tasks": rest[index : index + APPEND_MAX]}
            if index + APPEND_MAX >= len(rest):
                body["deliverable"] = "all"
            client.post(f"/runs/{run_id}/append", body)
        built = time.time()
        client.post("/awaits", {"token": gate_token, "value": "go"})
        released = time.time()
        requests = client.requests - requests_before

        def finished() -> bool:
            return Run.objects.filter(pk=run_id, status__in=("completed", "canceled", "needs_attention")).exists()

        # The finish time is the run's own `finished_at`: the polling interval does not enter the figure.
        wait_until(finished, timeout=900, interval=0.1, what=f"the fan run {run_id} to finish")
        row = Run.objects.get(pk=run_id)
        if row.status != "completed":
            raise RuntimeError(f"bench: the fan run ended {row.status}: {row.attention or row.failure}")
        done = Task.objects.filter(run=row, status="completed").count()
        if done != n + len(joins) + 1:
            raise RuntimeError(f"bench: the fan run completed only {done} of {n + len(joins) + 1} tasks")
        assert row.finished_at is not None
        seconds = row.finished_at.timestamp() - started
        transitions = TraceEvent.objects.filter(run=row, event="status").count()
        time.sleep(1.5)  # backends flush their statistics at most once a second; beat's sweep tasks keep running
        workers = probe.delta(workers_before, probe.snapshot(probe_dir))
        sessions_after, commits_after = db_counters()
    statements = workers["statements"]
    transactions = workers["commits"] + workers["rollbacks"]
    return {
        "seconds": seconds,
        "tasks_per_s": n / seconds,
        "transitions": transitions,
        "transitions_per_s": transitions / seconds,
        "build_seconds": built - started,
        "release_seconds": released - built,
        "requests": requests,
        "joins": len(joins),
        # From the workers themselves (bench/probe.py): Celery tasks run, statements, transactions, sessions.
        "worker_messages_per_task": workers["tasks"] / n,
        "worker_statements_per_task": statements / n,
        "worker_transactions_per_task": transactions / n,
        "worker_round_trips_per_task": (statements + 2 * transactions) / n,
        "worker_sessions_per_task": workers["sessions"] / n,
        # From pg_stat_database over the whole run (web server and workers), the bench's own statements taken out.
        "db_sessions_per_task": (sessions_after - sessions_before) / n,
        "db_commits_per_task": (commits_after - commits_before - own.count) / n,
        "bench_own_statements": own.count,
    }


def db_counters() -> tuple[int, int]:
    """Sessions opened and transactions committed so far in the bench database."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT sessions, xact_commit FROM pg_stat_database WHERE datname = current_database()")
        row = cursor.fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def _web_client(procs: Processes, workspace: Any, token: str, name: str, extra_env: dict[str, str] | None = None) -> Client:
    port, _ = procs.web_server(name, extra_env=extra_env)
    client = Client(port, token)
    # Warm the web server and its workers up (imports, database sessions) outside the measurement.
    warm = client.post(f"/workspaces/{workspace.slug}/runs", {"tasks": [{"key": "gate", "kind": "await"}]}, expect=201)
    echoes = [{"key": f"e{i}", "kind": "tool", "tool": "test.echo"} for i in range(8)]
    client.post(f"/runs/{warm['run']['id']}/append", {"tasks": echoes})
    from runs.models import Task

    def warm_done() -> bool:
        return not Task.objects.filter(run_id=warm["run"]["id"], kind="tool").exclude(status="completed").exists()

    wait_until(warm_done, timeout=300, interval=0.1, what=f"the warm-up run through {name}")
    return client


def run(
    profile: Profile,
    env: Environment,
    procs: Processes,
    *,
    peer_queue: str,
    with_fan: bool = True,
    sessions_ab: bool = False,
) -> Section:
    """The fan and the references, A and B interleaved in each repetition.

    With `sessions_ab`, the fan also runs on a second web server and worker pool of its own queue
    whose workers open a database session per task (OZ0_CELERY_DB_REUSE_MAX=0, Celery's Django
    fixup closing the connection around every task, as before it was set)."""
    from bench.harness import bench_team
    from tenancy import tokens

    n = profile.fan_tasks
    workspace, user = bench_team("fan")
    token = tokens.issue(user=user, label="bench")[0]
    client: Client | None = None
    closing: Client | None = None
    closing_queue = f"{env.queue}-close"
    if with_fan:
        client = _web_client(procs, workspace, token, "daphne-fan")
    if with_fan and sessions_ab:
        closing_env = {"OZ0_QUEUE": closing_queue, "OZ0_CELERY_DB_REUSE_MAX": "0"}
        procs.celery_worker("celery-close", queue=closing_queue, extra_env=closing_env)
        closing = _web_client(procs, workspace, token, "daphne-close", closing_env)
    has_pgbench = physical.pgbench_available()
    if has_pgbench:
        physical.pgbench_init(env.database_url)
    samples: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {}
    extra: dict[str, list[dict[str, float]]] = {"fan": [], "fan_close": [], "celery": [], "peer": [], "pgqueuer": []}

    def add(key: str, value: float) -> None:
        samples.setdefault(key, []).append(value)

    steps: list[tuple[str, Callable[[], None]]] = []

    def do_celery() -> None:
        result = celery_bare.measure(n, env.redis_url, env.queue)
        extra["celery"].append(result)
        add("celery", result["tasks_per_s"])

    def do_fan() -> None:
        assert client is not None
        result = run_fan(n, workspace, client, procs.probe_dir)
        extra["fan"].append(result)
        add("fan", result["tasks_per_s"])
        add("transitions", result["transitions_per_s"])

    def do_fan_closing() -> None:
        assert closing is not None
        result = run_fan(n, workspace, closing, procs.probe_dir)
        extra["fan_close"].append(result)
        add("fan_close", result["tasks_per_s"])

    def do_peer() -> None:
        result = peer.measure(n, peer_queue)
        extra["peer"].append(result)
        add("peer", result["tasks_per_s"])

    def do_pgqueuer() -> None:
        result = pgqueuer_peer.measure(n, peer_queue)
        extra["pgqueuer"].append(result)
        add("pgqueuer", result["tasks_per_s"])

    def do_physical() -> None:
        add("update", physical.update_rate(env.database_url, profile.update_seconds))
        if has_pgbench:
            add("pgbench", physical.pgbench_rate(env.database_url, profile.update_seconds))
        add("redis", physical.redis_rate(env.redis_url, profile.redis_seconds))

    steps = [("bare Celery", do_celery)]
    if with_fan:
        steps.append(("oz0 fan", do_fan))
    if closing is not None:
        steps.append(("oz0 fan, a session per task", do_fan_closing))
    steps += [("procrastinate", do_peer), ("pgqueuer", do_pgqueuer), ("physical limit", do_physical)]

    for rep in range(profile.reps):
        order = steps[rep % len(steps) :] + steps[: rep % len(steps)]
        for label, step in order:
            before = {k: len(v) for k, v in samples.items()}
            step()
            latest = ", ".join(f"{k} {v[-1]:,.1f}/s" for k, v in samples.items() if len(v) > before.get(k, 0))
            say(f"fan/references rep {rep + 1}/{profile.reps}: {label}: {latest}")
        if with_fan:
            ratios.setdefault("fan_vs_celery", []).append(samples["fan"][rep] / samples["celery"][rep])
            ratios.setdefault("fan_vs_peer", []).append(samples["fan"][rep] / samples["peer"][rep])
            ratios.setdefault("fan_vs_pgqueuer", []).append(samples["fan"][rep] / samples["pgqueuer"][rep])
            ratios.setdefault("transitions_vs_update", []).append(samples["transitions"][rep] / samples["update"][rep])
        if closing is not None:
            ratios.setdefault("kept_vs_closed", []).append(samples["fan"][rep] / samples["fan_close"][rep])
            ratios.setdefault("closed_vs_celery", []).append(samples["fan_close"][rep] / samples["celery"][rep])
        ratios.setdefault("celery_vs_update", []).append(samples["celery"][rep] / samples["update"][rep])
        ratios.setdefault("peer_vs_update", []).append(samples["peer"][rep] / samples["update"][rep])
        ratios.setdefault("pgqueuer_vs_update", []).append(samples["pgqueuer"][rep] / samples["update"][rep])

    section = Section()
    f = section.figures
    f[f"single-row UPDATE commits/s ({WORKER_PROCESSES} conns)"] = summary(samples["update"], "commits/s", digits=0)
    if has_pgbench:
        f[f"pgbench -N tps ({WORKER_PROCESSES} clients)"] = summary(samples["pgbench"], "tx/s", digits=0)
    f["Redis round trips/s (1 conn)"] = summary(samples["redis"], "round trips/s", digits=0)
    f[f"bare Celery no-ops ({n}, {WORKER_PROCESSES} procs)"] = summary(samples["celery"], "tasks/s", digits=1)
    f[f"procrastinate no-ops ({n}, {WORKER_PROCESSES} procs)"] = summary(samples["peer"], "tasks/s", digits=1)
    f[f"pgqueuer no-ops ({n}, {WORKER_PROCESSES} procs)"] = summary(samples["pgqueuer"], "tasks/s", digits=1)
    if with_fan:
        f[f"oz0 fan tasks/s ({n} echo + {extra['fan'][0]['joins']} joins)"] = summary(samples["fan"], "tasks/s", digits=1)
        f["oz0 fan state transitions/s"] = summary(samples["transitions"], "transitions/s", digits=1)
        f["ratio: fan tasks/s / bare Celery"] = summary(ratios["fan_vs_celery"], "x")
        f["ratio: fan tasks/s / procrastinate"] = summary(ratios["fan_vs_peer"], "x")
        f["ratio: fan tasks/s / pgqueuer"] = summary(ratios["fan_vs_pgqueuer"], "x")
        f["ratio: fan transitions/s / UPDATE commits/s"] = summary(ratios["transitions_vs_update"], "x")
        if closing is not None:
            f["fan, a session per task (OZ0_CELERY_DB_REUSE_MAX=0)"] = summary(samples["fan_close"], "tasks/s", digits=1)
            f["ratio: fan, a session per task / bare Celery"] = summary(ratios["closed_vs_celery"], "x")
            f["ratio: fan, sessions kept / a session per task"] = summary(ratios["kept_vs_closed"], "x")
            f["fan, a session per task: sessions opened per task (workers)"] = summary(
                [r["worker_sessions_per_task"] for r in extra["fan_close"]], "sessions"
            )
        runs = extra["fan"]
        f[f"fan: build through the API ({runs[0]['requests']} requests, counted)"] = summary(
            [r["build_seconds"] for r in runs], "s"
        )
        f["fan: releasing the gate (POST /awaits)"] = summary([r["release_seconds"] for r in runs], "s")
        per_task = (
            ("worker_messages_per_task", "fan: Celery tasks run per task (workers)", "messages"),
            ("worker_statements_per_task", "fan: SQL statements per task (workers)", "statements"),
            ("worker_round_trips_per_task", "fan: database round trips per task (workers)", "round trips"),
            ("worker_transactions_per_task", "fan: transactions per task (workers)", "xacts"),
            ("worker_sessions_per_task", "fan: sessions opened per task (workers)", "sessions"),
            ("db_commits_per_task", "fan: db commits per task (all clients, bench's own out)", "xacts"),
            ("db_sessions_per_task", "fan: db sessions opened per task (all clients)", "sessions"),
        )
        for key, label, unit in per_task:
            f[label] = summary([r[key] for r in runs], unit)
        section.goals.append(goal_at_least("tasks/s vs bare Celery", f["ratio: fan tasks/s / bare Celery"]["median"], 1.0, "x"))
        section.goals.append(
            goal_at_least(
                "transitions/s vs UPDATE commits/s", f["ratio: fan transitions/s / UPDATE commits/s"]["median"], 0.33, "x"
            )
        )
    f["ratio: bare Celery / UPDATE commits/s"] = summary(ratios["celery_vs_update"], "x")
    f["ratio: procrastinate / UPDATE commits/s"] = summary(ratios["peer_vs_update"], "x")
    f["ratio: pgqueuer / UPDATE commits/s"] = summary(ratios["pgqueuer_vs_update"], "x")
    section.extra = {"runs": extra, "tasks": n}
    for each in (client, closing):
        if each is not None:
            each.close()
    if closing is not None:
        import redis

        broker = redis.Redis.from_url(env.redis_url)
        broker.delete(closing_queue)
        broker.close()
    section.notes.append(
        "The fan is built as a client builds it: a create and appends of at most 64 tasks over HTTP with a bearer "
        "token, against daphne; the build is inside the measured time. Celery beat runs its sweeps throughout."
    )
    section.notes.append(
        "The kernel caps a join's `after` at 32 sources (too_wide_a_fan), so the one `all` join is a tree of "
        f"`all` joins of at most 32 sources ({extra['fan'][0]['joins'] if with_fan else '-'} joins for {n} tasks)."
    )
    return section
