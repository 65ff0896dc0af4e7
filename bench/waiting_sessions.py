"""`python -m bench.waiting_sessions [N] [--acp]` (issue 29: waits hold nothing): N JSON-lines sessions
(with `--acp`, ACP agents) waiting on a person at once in one session-worker process, and what they
hold there: threads, the process's memory (RSS) and its harness processes', database connections;
then the answers, and how long the N sessions take to finish.

The process plays the session worker: a pool of OZ0_SESSION_SLOTS threads runs `execute_session`
for each run, as Celery's thread pool would; each session asks (`oz.ask`) and, past the park clock
(0.2 s here), is released to the keeper and gives its thread back. The harness is a shell script
(bench/waiting_program.sh; with `--acp`, bench/waiting_acp_agent.sh, an ACP agent asking permission
for a tool of its own, which a person approves) confined as every harness is, so the figures are
oz0's, not a framework's. It runs on a database of its own (`<name>_bench`, or OZ0_BENCH_DATABASE_URL).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def main(argv: list[str]) -> int:
    from bench import harness

    acp = "--acp" in argv
    argv = [a for a in argv if a != "--acp"]
    n = int(argv[0]) if argv else 1000
    env = harness.prepare_environment()
    harness.ensure_database(env.database_url)
    programs = Path(tempfile.mkdtemp(prefix="oz0-bench-programs-")) / "programs.yaml"
    programs.write_text(f"waiting: [sh, {HERE / 'waiting_program.sh'}]\nwaiting-acp: [sh, {HERE / 'waiting_acp_agent.sh'}]\n")
    os.environ.update({"OZ0_HARNESS_PROGRAMS": str(programs), "OZ0_HARNESS_PROCESSES": "0"})
    harness.setup_django()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0, interactive=False)
    settings.OZ0_SESSION_PARK_SECONDS = 0.2
    settings.OZ0_SESSION_SLOTS_PER_WORKSPACE = settings.OZ0_SESSION_SLOTS
    from oz0agents.registry import register
    from runs import kernel
    from runs.models import Run, Task
    from runs.worker.execution import execute_session
    from runs.worker.harness.keeper import released_count

    kernel.install_sender(lambda *args, **kwargs: None)  # the bench drives the sessions itself
    workspace, user = harness.bench_team("waiting")
    manifest = {
        "name": "waiting-acp" if acp else "waiting",
        "instructions": "Ask, then end.",
        "harness": {"acp": {"program": "waiting-acp"}} if acp else {"jsonl": {"program": "waiting"}},
        "tools": ["oz.ask"],
        "failures": [],
        "approval": {"mode": "ask"},
    }
    registered = register(json.dumps(manifest), workspace=workspace)
    database = harness.database_name(env.database_url)

    def connections() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [database])
            return int(cursor.fetchone()[0]) - 1  # not this query's own

    def snapshot() -> dict[str, Any]:
        children = descendants(os.getpid())
        return {
            "threads": threading.active_count(),
            "rss_mb": round(rss_mb(os.getpid()), 1),
            "harness_processes": len(children),
            "harness_rss_mb": round(sum(rss_mb(pid) for pid in children), 1),
            "database_connections": connections(),
            "released": released_count(),
        }

    before = snapshot()
    harness.say(f"creating {n} runs")
    runs = [kernel.create_run(workspace=workspace, user=user, body={"agent": registered.version.agent.name})[0] for _ in range(n)]
    rounds = dict(Task.objects.filter(run__in=runs, key="r1").values_list("run_id", "pk"))

    def session(run: Any) -> None:
        try:
            while not execute_session(rounds[run.pk], str(run.pk)):
                time.sleep(0.1)
        finally:
            connection.close()

    harness.say(f"starting {n} sessions on {settings.OZ0_SESSION_SLOTS} threads")
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=settings.OZ0_SESSION_SLOTS, thread_name_prefix="celery-pool") as pool:
        list(pool.map(session, runs))
        waiting = snapshot()  # the pool's threads still stand, as a worker's would
    harness.wait_until(lambda: released_count() == n, timeout=600, what="every session released")
    waiting = {**waiting, "seconds_to_release_all": round(time.monotonic() - started, 1)}
    harness.say(f"{n} sessions waiting: {waiting}")
    started = time.monotonic()
    for run in runs:
        if acp:
            kernel.approve(run_id=run.pk, key="r1.1", user=user)
        else:
            kernel.answer(run_id=run.pk, key="r1.1", user=user, value="yes")
    harness.wait_until(
        lambda: Run.objects.filter(pk__in=[r.pk for r in runs], status="completed").count() == n,
        timeout=1800,
        interval=1.0,
        what="every run completed",
    )
    answered = round(time.monotonic() - started, 1)
    after = snapshot()
    result = {
        "harness": "acp" if acp else "jsonl",
        "sessions": n,
        "before": before,
        "waiting": waiting,
        "seconds_answer_to_all_completed": answered,
        "after": after,
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
