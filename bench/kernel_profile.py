"""`python -m bench.kernel_profile [N]`: where one task's kernel work goes, without workers or a broker in the way.

Builds a run of N `test.echo` tasks behind an await on the bench database, sends their Celery
messages to a queue nobody consumes (dropped afterwards), then plays the worker's part
in-process for each task: `claim_task` and `task_complete`, timing each and counting its SQL
statements. Prints the medians, the statements of one claim and one completion, and a cProfile
of the whole loop. Evidence for kernel work, not a benchmark figure.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import secrets
import statistics
import sys
import time
from typing import Any


def print_profile(profiler: cProfile.Profile, order: str, rows: int) -> None:
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats(order).print_stats(rows)
    print(stream.getvalue())


class StatementTimes:
    """An execute wrapper that times every SQL statement, grouped by its first 110 characters."""

    def __init__(self) -> None:
        self.by_statement: dict[str, list[float]] = {}

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.by_statement.setdefault(" ".join(sql.split())[:110], []).append((time.perf_counter() - started) * 1000)

    def print_table(self) -> None:
        print(f"{'statement (first 110 chars)':<110} {'count':>5} {'total ms':>9} {'median ms':>9}")
        for sql, spent in sorted(self.by_statement.items(), key=lambda kv: -sum(kv[1])):
            print(f"{sql:<110} {len(spent):>5} {sum(spent):>9.0f} {statistics.median(spent):>9.2f}")


def main(argv: list[str]) -> int:
    from bench import harness

    mode = argv[0] if argv and not argv[0].isdigit() else "tasks"
    numbers = [a for a in argv if a.isdigit()]
    n = int(numbers[0]) if numbers else 300
    env = harness.prepare_environment()
    harness.ensure_database(env.database_url)
    harness.setup_django()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0, interactive=False)
    from runs import kernel

    workspace, user = harness.bench_team("profile")
    if mode in ("chain", "tree"):
        return propagate_profile(mode, n, workspace, user, env)
    if mode == "worker":
        return worker_profile(n, workspace, user, env)
    if mode == "append":
        return append_profile(n, workspace, user, env)
    if mode == "batch":
        return batch_profile(n, workspace, user, env)
    if mode == "steps":
        return steps_profile(n, workspace, user, env)
    if mode == "document":
        return document_profile(n, workspace, user, env)
    run, ids = gated_echo_run(n, workspace, user)

    claim_ms: list[float] = []
    complete_ms: list[float] = []
    claim_q: list[int] = []
    complete_q: list[int] = []
    statements: dict[str, list[str]] = {"claim": [], "complete": []}

    def capture(kind: str) -> Any:
        def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            if len(statements[kind]) < 60 and capturing[0]:
                statements[kind].append(sql[:160])
            return execute(sql, params, many, context)

        return wrapper

    capturing = [True]
    profiler = cProfile.Profile()
    profiler.enable()
    for task_id in ids:
        with harness.QueryCounter() as q1, connection.execute_wrapper(capture("claim")):
            t = time.perf_counter()
            claimed = kernel.claim_task(None, task_id, f"profile-{task_id}")
            claim_ms.append((time.perf_counter() - t) * 1000)
        assert claimed is not None
        with harness.QueryCounter() as q2, connection.execute_wrapper(capture("complete")):
            t = time.perf_counter()
            kernel.task_complete(claimed, claimed.spec["args"]["value"])
            complete_ms.append((time.perf_counter() - t) * 1000)
        capturing[0] = False  # the statements of the first task are enough
        claim_q.append(q1.count)
        complete_q.append(q2.count)
    profiler.disable()

    print(
        f"{n} tasks, in-process, one run: claim {statistics.median(claim_ms):.2f} ms / {statistics.median(claim_q)} statements, "
        f"complete {statistics.median(complete_ms):.2f} ms / {statistics.median(complete_q)} statements (medians)"
    )
    for kind, sqls in statements.items():
        print(f"\n-- the statements of one {kind}:")
        for sql in sqls:
            print("  ", sql)
    print_profile(profiler, "cumulative", 35)
    import redis

    redis.Redis.from_url(env.redis_url).delete(env.queue)
    return 0


def worker_profile(n: int, workspace: Any, user: Any, env: Any) -> int:
    """The worker's whole path per task (`runs.worker.execution.execute_task`, as the Celery task calls it),
    in-process: statements, new database sessions and time per task."""
    import redis
    from django.db import connection

    from bench import harness
    from runs.models import Task
    from runs.worker import execution

    run, ids = gated_echo_run(n, workspace, user)
    opened = [0]
    original_connect = connection.connect

    def counting_connect() -> None:
        opened[0] += 1
        original_connect()

    connection.connect = counting_connect  # type: ignore[method-assign]
    # Blocks of 25 tasks alternate the project's setting (CONN_MAX_AGE 0: a new session per task)
    # with persistent connections (None), side by side.
    modes = {"CONN_MAX_AGE=0 (the default)": 0, "CONN_MAX_AGE=None (persistent)": None}
    per_task_ms: dict[str, list[float]] = {m: [] for m in modes}
    statements: dict[str, int] = dict.fromkeys(modes, 0)
    sessions: dict[str, int] = dict.fromkeys(modes, 0)
    for block, start in enumerate(range(0, len(ids), 25)):
        mode = list(modes)[block % 2]
        connection.close()
        connection.settings_dict["CONN_MAX_AGE"] = modes[mode]
        before = opened[0]
        with harness.QueryCounter() as queries:
            for task_id in ids[start : start + 25]:
                started = time.perf_counter()
                execution.execute_task(task_id)
                per_task_ms[mode].append((time.perf_counter() - started) * 1000)
        statements[mode] += queries.count
        sessions[mode] += opened[0] - before
    connection.connect = original_connect  # type: ignore[method-assign]
    done = Task.objects.filter(pk__in=ids, status="completed").count()
    print(f"{done}/{n} tasks through runs.worker.execution.execute_task in-process, blocks of 25 alternating:")
    for mode, times in per_task_ms.items():
        print(
            f"  {mode:<32} {statistics.median(times):6.1f} ms per task (median of {len(times)}), "
            f"{statements[mode] / len(times):.1f} statements, {sessions[mode] / len(times):.2f} new sessions per task"
        )
    redis.Redis.from_url(env.redis_url).delete(env.queue)
    return 0


def propagate_profile(shape: str, n: int, workspace: Any, user: Any, env: Any) -> int:
    """cProfile of one failing transition over `n` descendants (see bench.propagate)."""
    import redis

    from bench import harness, propagate
    from runs import kernel

    run, root_id = propagate.build(n, shape, workspace, user)
    claimed = kernel.claim_task(None, root_id, "profile")
    assert claimed is not None
    from django.db import connection

    profiler = cProfile.Profile()
    timing = StatementTimes()

    with harness.QueryCounter() as queries, connection.execute_wrapper(timing):
        started = time.perf_counter()
        profiler.enable()
        kernel.task_fail(claimed, "tool_failed", "profile")
        profiler.disable()
        ms = (time.perf_counter() - started) * 1000
    print(f"{shape} of {n}: failing transition {ms:.0f} ms, {queries.count} statements")
    timing.print_table()
    print_profile(profiler, "tottime", 25)
    redis.Redis.from_url(env.redis_url).delete(env.queue)
    return 0


def batch_profile(n: int, workspace: Any, user: Any, env: Any) -> int:
    """The worker's path for chunks of 16 quick calls (`execute_batch`, as the Celery task calls
    it), in-process over a gated fan of n echoes: time and statements per chunk, and a cProfile."""
    import redis
    from django.db import connection

    from bench import harness
    from runs.models import Task
    from runs.worker import execution

    run, ids = gated_echo_run(n, workspace, user)
    timing = StatementTimes()

    chunk_ms: list[float] = []
    profiler = cProfile.Profile()
    with harness.QueryCounter() as queries, connection.execute_wrapper(timing):
        for start in range(0, len(ids), 16):
            started = time.perf_counter()
            profiler.enable()
            execution.execute_batch(ids[start : start + 16], str(run.pk))
            profiler.disable()
            chunk_ms.append((time.perf_counter() - started) * 1000)
    done = Task.objects.filter(pk__in=ids, status="completed").count()
    print(
        f"{done}/{n} calls in {len(chunk_ms)} chunks of 16 in-process: {statistics.median(chunk_ms):.1f} ms per chunk "
        f"(median), {queries.count / len(chunk_ms):.1f} statements per chunk"
    )
    timing.print_table()
    print_profile(profiler, "cumulative", 50)
    redis.Redis.from_url(env.redis_url).delete(env.queue)
    return 0


def bearer_client(user: Any) -> Any:
    """Django's test client as an API client of `user`, with a bearer token of its own."""
    from django.test import Client

    from tenancy.models import ApiToken
    from tenancy.tokens import token_digest

    token = secrets.token_urlsafe(24)
    ApiToken.objects.create(user=user, digest=token_digest(token), label="profile")
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


def append_profile(n: int, workspace: Any, user: Any, env: Any) -> int:
    """A client's build of n echo calls through the JSON API (Django's whole stack, bearer token,
    64 tasks per append), no worker consuming: time and statements per append, and a cProfile."""
    import json

    import redis

    from bench import harness

    client = bearer_client(user)
    tasks = [{"key": f"e{i}", "kind": "tool", "tool": "test.echo", "args": {"value": i}} for i in range(1, n + 1)]
    created = client.post(
        f"/api/v1/workspaces/{workspace.slug}/runs",
        json.dumps({"tasks": [{"key": "gate", "kind": "await", "question": "open"}, *tasks[:63]]}),
        content_type="application/json",
    )
    assert created.status_code == 201, created.content[:300]
    run_id = created.json()["run"]["id"]
    times: list[float] = []
    counts: list[int] = []
    timing = StatementTimes()

    from django.db import connection

    profiler = cProfile.Profile()
    for index in range(63, n, 64):
        body = json.dumps({"tasks": tasks[index : index + 64]})
        with harness.QueryCounter() as queries, connection.execute_wrapper(timing):
            started = time.perf_counter()
            profiler.enable()
            answer = client.post(f"/api/v1/runs/{run_id}/append", body, content_type="application/json")
            profiler.disable()
            times.append((time.perf_counter() - started) * 1000)
        assert answer.status_code == 200, answer.content[:300]
        counts.append(queries.count)
    print(
        f"{len(times)} appends of 64 over the API in-process: {statistics.median(times):.1f} ms, {statistics.median(counts)} statements (medians)"
    )
    timing.print_table()
    print_profile(profiler, "cumulative", 45)
    print_profile(profiler, "tottime", 25)
    redis.Redis.from_url(env.redis_url).delete(env.queue)
    return 0


def steps_profile(n: int, workspace: Any, user: Any, env: Any) -> int:
    """The chain's step (bench.chain) in-process: a chain of n echo calls played by
    `execute_batch` as the Celery task calls it (each settle claims the next step), re-entered
    whenever its continuation ends; time and statements per step, and a cProfile."""
    import redis
    from django.db import connection

    from bench import chain, harness
    from runs.models import Run, Task
    from runs.worker import execution

    run_id = chain.build_chain(n, workspace, user)
    timing = StatementTimes()
    profiler = cProfile.Profile()
    entries = 0
    with harness.QueryCounter() as queries, connection.execute_wrapper(timing):
        started = time.perf_counter()
        while True:
            ready = list(
                Task.objects.filter(run_id=run_id, kind="tool", status="waiting", ready=True).values_list("pk", flat=True)
            )
            if not ready:
                break
            entries += 1
            profiler.enable()
            execution.execute_batch(ready, str(run_id))
            profiler.disable()
        ms = (time.perf_counter() - started) * 1000
    status = Run.objects.get(pk=run_id).status
    print(
        f"chain of {n} in-process ({status}, {entries} entries): {ms / n:.2f} ms per step, "
        f"{queries.count / n:.1f} statements per step"
    )
    timing.print_table()
    print_profile(profiler, "tottime", 30)
    print_profile(profiler, "cumulative", 40)
    redis.Redis.from_url(env.redis_url).delete(env.queue)
    return 0


def document_profile(n: int, workspace: Any, user: Any, env: Any) -> int:
    """The run document of a run of n echo calls over the API (`GET /runs/{id}`, what a verb
    such as the fan's gate release answers): time per request and a cProfile."""
    import redis

    run, _ = gated_echo_run(n, workspace, user)
    client = bearer_client(user)
    times: list[float] = []
    profiler = cProfile.Profile()
    for _ in range(5):
        started = time.perf_counter()
        profiler.enable()
        answer = client.get(f"/api/v1/runs/{run.pk}")
        profiler.disable()
        times.append((time.perf_counter() - started) * 1000)
        assert answer.status_code == 200, answer.content[:300]
    print(f"the document of {n} tasks: {statistics.median(times):.0f} ms (median of 5), {len(answer.content):,} bytes")
    print_profile(profiler, "cumulative", 40)
    print_profile(profiler, "tottime", 25)
    redis.Redis.from_url(env.redis_url).delete(env.queue)
    return 0


def gated_echo_run(n: int, workspace: Any, user: Any) -> tuple[Any, list[int]]:
    """A run of n `test.echo` calls behind an unanswered await, built 64 tasks per request; the call ids."""
    from runs import kernel
    from runs.models import Task

    tasks = [{"key": f"e{i}", "kind": "tool", "tool": "test.echo", "args": {"value": i}} for i in range(1, n + 1)]
    run, _ = kernel.create_run(
        workspace=workspace, user=user, body={"tasks": [{"key": "gate", "kind": "await", "question": "open"}, *tasks[:63]]}
    )
    for index in range(63, n, 64):
        kernel.append(run_id=run.id, user=user, body={"tasks": tasks[index : index + 64]})
    return run, list(Task.objects.filter(run=run, kind="tool").order_by("position").values_list("pk", flat=True))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
