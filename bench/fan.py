"""`fan`: one run of N no-op tool tasks (`test.echo`) built with appends, joined by one `all` join.

The run is created with a client-authored await (`gate`) that keeps it open while the bench
appends the rest; the echo tasks start as soon as their append commits. The kernel caps a
join's `after` at 32 sources (`too_wide_a_fan`), so the one `all` join over N tasks is a tree
of `all` joins of at most 32 sources each (N=5,000: 157 + 5 + 1 joins); the top one, `all`,
is the deliverable. The clock runs from the create call to the run's `finished_at`.

Interleaved with it in every repetition (rotating the order): bare Celery no-ops, procrastinate
no-ops, the single-row UPDATE commit rate, pgbench -N and the Redis round-trip rate.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bench import celery_bare, peer, physical
from bench.harness import (
    WORKER_PROCESSES,
    Environment,
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


def run_fan(n: int, workspace: Any, user: Any) -> dict[str, float]:
    """Build and run one fan; returns its timings (seconds, tasks/s, transitions/s)."""
    from runs import kernel
    from runs.models import Run, Task, TraceEvent

    sessions_before, commits_before = db_counters()
    echoes = [{"key": f"e{i}", "kind": "tool", "tool": "test.echo", "args": {"value": i}} for i in range(1, n + 1)]
    joins = join_tree([e["key"] for e in echoes])
    started = time.time()
    first = echoes[: APPEND_MAX - 1]
    run, receipt = kernel.create_run(
        workspace=workspace,
        user=user,
        body={"tasks": [{"key": "gate", "kind": "await", "question": "hold the run open while it is built"}, *first]},
    )
    rest = echoes[len(first) :] + joins
    for index in range(0, len(rest), APPEND_MAX):
        chunk = rest[index : index + APPEND_MAX]
        body: dict[str, Any] = {"tasks": chunk}
        if index + APPEND_MAX >= len(rest):
            body["deliverable"] = "all"
        kernel.append(run_id=run.id, user=user, body=body)
    built = time.time()
    kernel.resolve_await(token=receipt["tokens"]["gate"], user=user, value="go")

    def finished() -> bool:
        return Run.objects.filter(pk=run.id, status__in=("completed", "canceled", "needs_attention")).exists()

    wait_until(finished, timeout=900, interval=0.02, what=f"the fan run {run.id} to finish")
    row = Run.objects.get(pk=run.id)
    if row.status != "completed":
        raise RuntimeError(f"bench: the fan run ended {row.status}: {row.attention or row.failure}")
    done = Task.objects.filter(run=row, status="completed").count()
    if done != n + len(joins) + 1:
        raise RuntimeError(f"bench: the fan run completed only {done} of {n + len(joins) + 1} tasks")
    assert row.finished_at is not None
    seconds = row.finished_at.timestamp() - started
    transitions = TraceEvent.objects.filter(run=row, event="status").count()
    time.sleep(1.2)  # backends flush their statistics at most once a second
    sessions_after, commits_after = db_counters()
    return {
        "seconds": seconds,
        "tasks_per_s": n / seconds,
        "transitions": transitions,
        "transitions_per_s": transitions / seconds,
        "build_seconds": built - started,
        "joins": len(joins),
        # From pg_stat_database over the whole run (every client of the bench database, mostly the workers).
        "db_sessions_per_task": (sessions_after - sessions_before) / n,
        "db_commits_per_task": (commits_after - commits_before) / n,
    }


def db_counters() -> tuple[int, int]:
    """Sessions opened and transactions committed so far in the bench database."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT sessions, xact_commit FROM pg_stat_database WHERE datname = current_database()")
        row = cursor.fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def run(profile: Profile, env: Environment, *, peer_queue: str, with_fan: bool = True) -> Section:
    """The fan and the references, A and B interleaved in each repetition."""
    from bench.harness import bench_team

    n = profile.fan_tasks
    workspace, user = bench_team("fan")
    has_pgbench = physical.pgbench_available()
    if has_pgbench:
        physical.pgbench_init(env.database_url)
    samples: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {}
    extra: dict[str, list[dict[str, float]]] = {"fan": [], "celery": [], "peer": []}

    def add(key: str, value: float) -> None:
        samples.setdefault(key, []).append(value)

    steps: list[tuple[str, Callable[[], None]]] = []

    def do_celery() -> None:
        result = celery_bare.measure(n, env.redis_url, env.queue)
        extra["celery"].append(result)
        add("celery", result["tasks_per_s"])

    def do_fan() -> None:
        result = run_fan(n, workspace, user)
        extra["fan"].append(result)
        add("fan", result["tasks_per_s"])
        add("transitions", result["transitions_per_s"])

    def do_peer() -> None:
        result = peer.measure(n, peer_queue)
        extra["peer"].append(result)
        add("peer", result["tasks_per_s"])

    def do_physical() -> None:
        add("update", physical.update_rate(env.database_url, profile.update_seconds))
        if has_pgbench:
            add("pgbench", physical.pgbench_rate(env.database_url, profile.update_seconds))
        add("redis", physical.redis_rate(env.redis_url, profile.redis_seconds))

    steps = [("bare Celery", do_celery)]
    if with_fan:
        steps.append(("oz0 fan", do_fan))
    steps += [("procrastinate", do_peer), ("physical limit", do_physical)]

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
            ratios.setdefault("transitions_vs_update", []).append(samples["transitions"][rep] / samples["update"][rep])
        ratios.setdefault("celery_vs_update", []).append(samples["celery"][rep] / samples["update"][rep])
        ratios.setdefault("peer_vs_update", []).append(samples["peer"][rep] / samples["update"][rep])

    section = Section()
    f = section.figures
    f[f"single-row UPDATE commits/s ({WORKER_PROCESSES} conns)"] = summary(samples["update"], "commits/s", digits=0)
    if has_pgbench:
        f[f"pgbench -N tps ({WORKER_PROCESSES} clients)"] = summary(samples["pgbench"], "tx/s", digits=0)
    f["Redis round trips/s (1 conn)"] = summary(samples["redis"], "round trips/s", digits=0)
    f[f"bare Celery no-ops ({n}, {WORKER_PROCESSES} procs)"] = summary(samples["celery"], "tasks/s", digits=1)
    f[f"procrastinate no-ops ({n}, {WORKER_PROCESSES} procs)"] = summary(samples["peer"], "tasks/s", digits=1)
    if with_fan:
        f[f"oz0 fan tasks/s ({n} echo + {extra['fan'][0]['joins']} joins)"] = summary(samples["fan"], "tasks/s", digits=1)
        f["oz0 fan state transitions/s"] = summary(samples["transitions"], "transitions/s", digits=1)
        f["ratio: fan tasks/s / bare Celery"] = summary(ratios["fan_vs_celery"], "x")
        f["ratio: fan tasks/s / procrastinate"] = summary(ratios["fan_vs_peer"], "x")
        f["ratio: fan transitions/s / UPDATE commits/s"] = summary(ratios["transitions_vs_update"], "x")
        f["fan: database sessions opened per task"] = summary(
            [r["db_sessions_per_task"] for r in extra["fan"]], "sessions", digits=2
        )
        f["fan: db transactions per task (incl. read-only)"] = summary(
            [r["db_commits_per_task"] for r in extra["fan"]], "xacts", digits=2
        )
        section.goals.append(goal_at_least("tasks/s vs bare Celery", f["ratio: fan tasks/s / bare Celery"]["median"], 1.0, "x"))
        section.goals.append(
            goal_at_least(
                "transitions/s vs UPDATE commits/s", f["ratio: fan transitions/s / UPDATE commits/s"]["median"], 0.33, "x"
            )
        )
    f["ratio: bare Celery / UPDATE commits/s"] = summary(ratios["celery_vs_update"], "x")
    f["ratio: procrastinate / UPDATE commits/s"] = summary(ratios["peer_vs_update"], "x")
    section.extra = {"runs": extra, "tasks": n}
    section.notes.append(
        "The kernel caps a join's `after` at 32 sources (too_wide_a_fan), so the one `all` join is a tree of "
        f"`all` joins of at most 32 sources ({extra['fan'][0]['joins'] if with_fan else '-'} joins for {n} tasks)."
    )
    return section
