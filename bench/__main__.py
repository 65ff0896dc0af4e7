"""`python -m bench [--quick] [--only NAME ...]`: run the benchmarks, print a table, write JSON.

`./oz0 bench ARGS` runs this with the venv active and DATABASE_URL / REDIS_URL set.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

WORKLOADS = (
    "references",
    "fan",
    "chain",
    "propagate",
    "inbox",
    "scorecard",
    "metrics",
    "live",
    "neighbors",
    "runpage",
    "chaos",
    "hosts",
)
# Run first the workloads that must not have workers consuming the bench queue.
ORDER = (
    "propagate",
    "inbox",
    "scorecard",
    "metrics",
    "references",
    "fan",
    "chain",
    "live",
    "neighbors",
    "runpage",
    "chaos",
    "hosts",
)
# Not in the full run: `chaos` breaks a stack of its own for ten minutes (`--only chaos`); `hosts`
# needs root for its network namespaces (`--only hosts`); `runpage` needs Chromium.
ON_REQUEST = ("chaos", "runpage", "hosts")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="./oz0 bench", description="oz0 against the physical limit and its peers, in one run")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, under 3 minutes")
    parser.add_argument("--tiny", action="store_true", help="toy sizes: checks the plumbing only (the smoke test)")
    parser.add_argument(
        "--only",
        action="append",
        choices=WORKLOADS,
        metavar="NAME",
        help=f"run only this workload (repeatable): {', '.join(WORKLOADS)}; fan includes the references",
    )
    parser.add_argument(
        "--sessions-ab",
        action="store_true",
        help="fan: also run the fan on a second worker pool that opens a database session per task "
        "(OZ0_CELERY_DB_REUSE_MAX=0), side by side in each repetition",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    from bench import harness

    # A TERM (./oz0 stopping, a CI timeout) unwinds like ^C, so the workers the bench started are stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    profile = harness.PROFILES["tiny" if args.tiny else "quick" if args.quick else "full"]
    selected = set(args.only or (w for w in WORKLOADS if w not in ON_REQUEST))
    if "fan" in selected:
        selected.discard("references")  # the fan measures the references interleaved with itself
    if selected in ({"chaos"}, {"hosts"}):
        return _own_stack_only(selected.pop(), profile.name)
    env = harness.prepare_environment()
    harness.say(f"bench ({profile.name}): database {harness.database_name(env.database_url)}, queue {env.queue}")
    harness.ensure_database(env.database_url)
    harness.setup_django()
    harness.migrate_and_reset()

    logdir = Path(tempfile.mkdtemp(prefix="oz0-bench-"))
    procs = harness.Processes(env, logdir)
    sections: dict[str, harness.Section] = {}
    started = time.time()
    peer_queue = f"{env.queue}-peer"
    workers_up = False

    def ensure_workers() -> None:
        nonlocal workers_up
        if workers_up:
            return
        _purge(env)
        harness.say(f"starting {harness.WORKER_PROCESSES} Celery worker processes")
        procs.celery_worker()
        # Production runs beat beside the workers: its sweeps (every OZ0_SWEEP_SECONDS) run during every measurement.
        procs.celery_beat()
        _warm_up(env, procs)
        workers_up = True

    try:
        for name in ORDER:
            if name not in selected:
                continue
            harness.say(f"== {name}")
            try:
                if name in ("fan", "references"):
                    from bench import peer, pgqueuer_peer

                    ensure_workers()
                    peer.ensure_schema(env.database_url)
                    peer.start_workers(procs, peer_queue)
                    pgqueuer_peer.ensure_schema(env.database_url)
                    pgqueuer_peer.start_workers(procs, peer_queue)
                    sections[name] = _fan(profile, env, procs, peer_queue, with_fan=name == "fan", sessions_ab=args.sessions_ab)
                elif name == "chain":
                    from bench import chain

                    ensure_workers()
                    sections[name] = chain.run(profile)
                elif name == "propagate":
                    from bench import propagate

                    if workers_up:
                        raise RuntimeError("propagate must run before the workers start")
                    sections[name] = propagate.run(profile)
                elif name == "inbox":
                    from bench import inbox

                    sections[name] = inbox.run(profile)
                elif name == "scorecard":
                    sections[name] = _scorecard(profile)
                elif name == "metrics":
                    sections[name] = _metrics(profile)
                elif name == "live":
                    from bench import live

                    ensure_workers()
                    sections[name] = live.run(profile, env, procs)
                elif name == "neighbors":
                    from bench import neighbors

                    ensure_workers()
                    sections[name] = neighbors.run(profile, env, procs)
                elif name == "runpage":
                    from bench import runpage

                    sections[name] = runpage.run(profile, procs)
                elif name == "hosts":
                    from bench import hosts

                    sections[name] = hosts.run(profile.name)
                elif name == "chaos":
                    from bench import chaos

                    sections[name] = chaos.run(profile.name)
                procs.check_alive()
            except Exception as error:  # one broken workload must not lose the others' figures
                traceback.print_exc()
                sections[name] = harness.Section(skipped=f"failed: {type(error).__name__}: {error}")
    finally:
        procs.stop()
        _purge(env)
        shutil.rmtree(logdir, ignore_errors=True)

    elapsed = time.time() - started
    data: dict[str, Any] = {
        "profile": profile.name,
        "command": "./oz0 bench"
        + (" --quick" if args.quick else "")
        + (" --tiny" if args.tiny else "")
        + (" --sessions-ab" if args.sessions_ab else "")
        + "".join(f" --only {o}" for o in (args.only or [])),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "seconds": round(elapsed, 1),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_average": os.getloadavg(),
            "postgres": _postgres_version(),
        },
        "git": _git_state(),
        "database": harness.database_name(env.database_url),
        "queue": env.queue,
        "worker_processes": harness.WORKER_PROCESSES,
        "workloads": {name: sections[name].as_json() for name in ORDER if name in sections},
    }
    path = harness.write_results(data)
    print(harness.table({name: sections[name] for name in ORDER if name in sections}))
    for name in ORDER:
        for note in sections[name].notes if name in sections else []:
            print(f"note ({name}): {note}")
    print(f"\n{data['command']} took {elapsed:.0f}s; figures written to {path}")
    return 0


def _own_stack_only(name: str, profile_name: str) -> int:
    """`--only chaos` (the faults) and `--only hosts` (worker hosts in network namespaces): on a
    stack of their own (their own PostgreSQL and Redis too), so none of the bench's database setup."""
    from bench import chaos, harness, hosts

    started = time.time()
    section = chaos.run(profile_name) if name == "chaos" else hosts.run(profile_name)
    data: dict[str, Any] = {
        "profile": profile_name,
        "command": f"./oz0 bench --only {name}" + (" --quick" if profile_name == "quick" else ""),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_average": os.getloadavg()},
        "git": _git_state(),
        "workloads": {name: section.as_json()},
    }
    path = harness.write_results(data)
    print(harness.table({name: section}))
    for note in section.notes:
        print(f"note ({name}): {note}")
    print(f"\n{data['command']} took {data['seconds']:.0f}s; figures written to {path}")
    return 0


def _fan(profile: Any, env: Any, procs: Any, peer_queue: str, *, with_fan: bool, sessions_ab: bool) -> Any:
    from bench import fan

    return fan.run(profile, env, procs, peer_queue=peer_queue, with_fan=with_fan, sessions_ab=sessions_ab)


def _scorecard(profile: Any) -> Any:
    from bench import scorecard
    from bench.harness import Section

    result = scorecard.run(profile.name == "quick" or profile.name == "tiny")
    if isinstance(result, Section):
        return result
    if isinstance(result, dict) and "figures" in result:
        from bench.harness import goal_at_most

        section = Section(
            figures=dict(result.get("figures", {})),
            notes=list(result.get("notes", [])),
            extra={k: v for k, v in result.items() if k not in ("figures", "notes")},
        )
        worst = result.get("scorecard_worst_median_server_ms")
        if worst is not None:
            section.goals.append(
                goal_at_most(f"server time at {result.get('findings', 0):,} findings (worst shape)", worst, 100, " ms")
            )
        return section
    return Section(extra={"result": result}, notes=["bench.scorecard.run returned no figures"])


def _metrics(profile: Any) -> Any:
    from bench import metrics
    from bench.harness import Section, goal_at_most

    result = metrics.run(profile.name == "quick", tasks=5_000 if profile.name == "tiny" else None)
    section = Section(
        figures=dict(result["figures"]),
        notes=list(result["notes"]),
        extra={k: v for k, v in result.items() if k not in ("figures", "notes")},
    )
    stored = result.get("tasks_stored", 0)
    section.goals.append(
        goal_at_most(f"one scrape at {stored:,} tasks stored", result["figures"]["scrape_wall"]["median"], 20, " ms")
    )
    return section


def _purge(env: Any) -> None:
    """Drop what is left of the bench's own queues in the broker (nothing else's)."""
    import redis

    client = redis.Redis.from_url(env.redis_url)
    try:
        client.delete(env.queue)
    finally:
        client.close()


def _warm_up(env: Any, procs: Any) -> None:
    """One echo run through the workers: both processes have imported everything and connected."""
    from bench.harness import bench_team, say, wait_until
    from runs import kernel
    from runs.models import Run

    workspace, user = bench_team("warmup")
    for _ in range(2):
        run, _ = kernel.create_run(
            workspace=workspace,
            user=user,
            body={"tasks": [{"key": f"w{i}", "kind": "tool", "tool": "test.echo", "args": {}} for i in range(8)]},
        )

        def done(run_id: Any = run.id) -> bool:
            procs.check_alive()
            return Run.objects.filter(pk=run_id, status="completed").exists()

        wait_until(done, timeout=120, interval=0.05, what="the warm-up run")
    say("workers are warm")


def _git_state() -> dict[str, Any]:
    """The commit measured, and whether the kernel or the worker path had uncommitted changes."""
    import subprocess

    from bench.harness import ROOT

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    dirty = git("status", "--porcelain", "--", "runs", "tenancy", "oz0site", "inbox", "insights")
    return {"commit": git("rev-parse", "--short", "HEAD"), "uncommitted_app_files": len(dirty.splitlines()) if dirty else 0}


def _postgres_version() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        row = cursor.fetchone()
    return str(row[0]) if row else ""


if __name__ == "__main__":
    sys.exit(main())
