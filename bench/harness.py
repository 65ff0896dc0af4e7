"""The bench's plumbing: its own database and queue, worker processes, progress, statistics, results.

The bench never touches the database or queue a developer works on: it derives a scratch
database from DATABASE_URL (`<name>_bench`, or OZ0_BENCH_DATABASE_URL), migrates it, empties
it at the start of each run, and sends Celery work to a queue of its own (`oz0-bench-<hex>`),
consumed only by the worker processes it starts.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(os.environ.get("OZ0_BENCH_RESULTS_DIR") or ROOT / "bench" / "results")
WORKER_PROCESSES = 2  # `celery worker -c 2 --pool prefork`; every reference uses as many


@dataclass(frozen=True)
class Profile:
    """Sizes and repetitions of one kind of run (`--quick`, the full run, the smoke test's tiny one)."""

    name: str
    reps: int
    fan_tasks: int
    chain_steps: int
    propagate_sizes: tuple[int, ...]
    propagate_reps: int
    inbox_rows: int
    inbox_reps: int
    live_runs: int
    live_waves: int
    live_fan: int  # a fan of this many quick calls runs (built over HTTP) while the live waves are measured
    update_seconds: float
    redis_seconds: float


PROFILES = {
    "full": Profile("full", 3, 5000, 200, (1000, 2000, 4000, 8000), 5, 10_000, 15, 100, 8, 5000, 3.0, 2.0),
    "quick": Profile("quick", 3, 200, 50, (250, 500, 1000), 3, 10_000, 9, 100, 4, 2000, 2.0, 1.0),
    "tiny": Profile("tiny", 1, 40, 5, (20, 40), 1, 60, 2, 3, 1, 40, 0.3, 0.2),
}


# ---------------------------------------------------------------------------
# progress
# ---------------------------------------------------------------------------

_T0 = time.monotonic()


def say(message: str) -> None:
    """One progress line on stderr, stamped with the seconds since the bench started."""
    print(f"[{time.monotonic() - _T0:7.1f}s] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------


def summary(values: Iterable[float], unit: str, *, digits: int = 3) -> dict[str, Any]:
    """Median with min and max beside it (and the raw values, for whoever wants more)."""
    data = [float(v) for v in values]
    if not data:
        return {"median": None, "min": None, "max": None, "n": 0, "unit": unit, "values": []}
    return {
        "median": round(statistics.median(data), digits),
        "min": round(min(data), digits),
        "max": round(max(data), digits),
        "n": len(data),
        "unit": unit,
        "values": [round(v, digits) for v in data],
    }


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


@dataclass
class Goal:
    name: str
    target: str
    value: float | None
    met: bool | None
    note: str = ""


@dataclass
class Section:
    """What one workload or reference hands back: figures (summaries), goals, notes, extras."""

    figures: dict[str, dict[str, Any]] = field(default_factory=dict)
    goals: list[Goal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["goals"] = [asdict(g) for g in self.goals]
        return data


def goal_at_least(name: str, value: float | None, target: float, unit: str = "") -> Goal:
    met = None if value is None else value >= target
    return Goal(name, f">= {target}{unit}", value, met)


def goal_at_most(name: str, value: float | None, target: float, unit: str = "") -> Goal:
    met = None if value is None else value <= target
    return Goal(name, f"<= {target}{unit}", value, met)


# ---------------------------------------------------------------------------
# environment: the bench's own database, queue and channel prefix
# ---------------------------------------------------------------------------


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


def database_name(url: str) -> str:
    return urlsplit(url).path.strip("/")


@dataclass
class Environment:
    database_url: str
    redis_url: str
    queue: str
    child_env: dict[str, str]


def prepare_environment() -> Environment:
    """Point this process (before Django starts) and its children at the bench's own database and queue."""
    base = os.environ.get("DATABASE_URL", "")
    if not base:
        raise SystemExit("bench: DATABASE_URL is not set (run it as ./oz0 bench, which sets it)")
    redis_url = os.environ.get("REDIS_URL", "")
    if not redis_url:
        raise SystemExit("bench: REDIS_URL is not set (run it as ./oz0 bench, which sets it)")
    bench_url = os.environ.get("OZ0_BENCH_DATABASE_URL") or ""
    if not bench_url:
        name = database_name(base)
        bench_url = base if name.endswith("_bench") else with_database(base, f"{name}_bench")
    queue = os.environ.get("OZ0_BENCH_QUEUE") or f"oz0-bench-{uuid.uuid4().hex[:8]}"
    settings_env = {
        "DATABASE_URL": bench_url,
        "REDIS_URL": redis_url,
        "OZ0_QUEUE": queue,
        "OZ0_TEST_TOOLS": "1",
        "OZ0_CHANNEL_PREFIX": f"oz0bench{queue[-8:]}",
        # Production-shaped: no per-query debug bookkeeping in any process.
        "DEBUG": "0",
        "SECRET_KEY": os.environ.get("SECRET_KEY") or secrets.token_urlsafe(50),
        "SECURE_SSL_REDIRECT": "0",
        "SESSION_COOKIE_SECURE": "0",
        "CSRF_COOKIE_SECURE": "0",
        "LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
        "DJANGO_SETTINGS_MODULE": "oz0site.settings",
    }
    os.environ.update(settings_env)
    child_env = {**os.environ, **settings_env}
    return Environment(bench_url, redis_url, queue, child_env)


def ensure_database(url: str) -> None:
    """Create the bench database when it is missing (on the same server as DATABASE_URL)."""
    import psycopg

    name = database_name(url)
    with psycopg.connect(with_database(url, "postgres"), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            say(f"creating the bench database {name}")
            conn.execute(f'CREATE DATABASE "{name}"')


def setup_django() -> None:
    import django

    django.setup()
    from django.conf import settings

    from oz0site.heap import freeze_startup_heap

    # The bench calls the kernel in-process (propagate, inbox): set up as oz0's web and worker
    # processes are, its startup objects frozen out of full collections.
    freeze_startup_heap()
    # The console pages render {% static %}; without collectstatic the manifest storage would refuse.
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }


def migrate_and_reset() -> None:
    """Migrate the bench database and empty the run store, so every run starts from the same state."""
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0, interactive=False)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename NOT IN "
            "('django_migrations', 'django_content_type', 'auth_permission', 'auth_group', 'auth_group_permissions')"
        )
        tables = [row[0] for row in cursor.fetchall()]
        if tables:
            cursor.execute("TRUNCATE " + ", ".join(f'"{t}"' for t in tables) + " RESTART IDENTITY CASCADE")
    connection.close()


# ---------------------------------------------------------------------------
# child processes
# ---------------------------------------------------------------------------


class Processes:
    """Child processes the bench started; each in its own session, stopped by its own group id."""

    def __init__(self, env: Environment, logdir: Path) -> None:
        self.env = env
        self.logdir = logdir
        self.children: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.probe_dir = logdir / "probe"
        self.probe_dir.mkdir(parents=True, exist_ok=True)

    def spawn(
        self,
        name: str,
        argv: list[str],
        *,
        extra_env: dict[str, str] | None = None,
        cwd: Path | None = None,
        pass_fds: tuple[int, ...] = (),
    ) -> subprocess.Popen[bytes]:
        self.logdir.mkdir(parents=True, exist_ok=True)
        log = open(self.logdir / f"{name}.log", "ab")  # noqa: SIM115 - kept open for the child's life
        proc = subprocess.Popen(
            argv,
            cwd=cwd or ROOT,
            env={**self.env.child_env, **(extra_env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=pass_fds,
        )
        self.children.append((name, proc))
        return proc

    def celery_worker(
        self, name: str = "celery", *, queue: str | None = None, extra_env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        queue = queue or self.env.queue
        return self.spawn(
            name,
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "oz0site",
                "worker",
                "-Q",
                queue,
                "-c",
                str(WORKER_PROCESSES),
                "--pool",
                "prefork",
                "-O",
                "fair",  # as `./oz0 up` runs it
                "-n",
                f"{queue}@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                # Counts what each task costs the database (bench/probe.py), in the workers themselves.
                "-I",
                "bench.probe",
                "-l",
                "warning",
            ],
            extra_env={
                "OZ0_BENCH_PROBE_DIR": str(self.probe_dir),
                "OZ0_QUEUE": queue,
                # The workspace share follows the processes really started (half of them).
                "OZ0_WORKER_CONCURRENCY": str(WORKER_PROCESSES),
                **(extra_env or {}),
            },
        )

    def celery_beat(self) -> subprocess.Popen[bytes]:
        """Beat as production runs it (`./oz0 up`): the sweeps land on the bench queue, run by the bench's workers."""
        return self.spawn(
            "beat",
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "oz0site",
                "beat",
                "-s",
                str(self.logdir / "celerybeat-schedule"),
                "--pidfile=",
                "-l",
                "warning",
            ],
        )

    def web_server(
        self, name: str = "daphne", *, extra_env: dict[str, str] | None = None, cwd: Path | None = None, count: int | None = None
    ) -> tuple[int, list[subprocess.Popen[bytes]]]:
        """The web processes serving the project's ASGI app on a free port, as `./oz0 up` serves it
        (OZ0_WEB_PROCESSES of them, default one a core, on one listening socket); returns once they
        answer. `cwd`: another tree of the project to serve (the `runpage` workload's page of before)."""
        from oz0cli import processes

        count = count or processes.web_process_count(os.environ)
        listening = processes.web_socket("127.0.0.1", 0)
        port = int(listening.getsockname()[1])
        argv = processes.command(
            "web", python=sys.executable, host="127.0.0.1", port=port, schedule=self.logdir, environ={}, listening=listening
        )
        # As `./oz0 up` runs its web processes.
        web_env = {**processes.web_environment(os.environ), **(extra_env or {})}
        with listening:  # each child holds its own copy: the socket closes when the last one ends
            started = [
                self.spawn(
                    name if count == 1 else f"{name}-{number}", argv, extra_env=web_env, cwd=cwd, pass_fds=(listening.fileno(),)
                )
                for number in range(1, count + 1)
            ]
        wait_until(lambda: self.answering(port), timeout=60, interval=0.1, what=f"{name} to answer")
        return port, started

    def answering(self, port: int) -> bool:
        from oz0cli.supervisor import answers

        self.check_alive()
        return answers("127.0.0.1", port)

    def stop(self, proc: subprocess.Popen[bytes] | list[subprocess.Popen[bytes]] | None = None) -> None:
        chosen = proc if isinstance(proc, list) else [proc] if proc is not None else None
        targets = [(n, p) for n, p in self.children if chosen is None or any(p is c for c in chosen)]
        for _, child in targets:
            if child.poll() is None:
                try:
                    os.killpg(child.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for _, child in targets:
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait(timeout=10)
        self.children = [(n, p) for n, p in self.children if (n, p) not in targets]

    def check_alive(self) -> None:
        for name, child in self.children:
            if child.poll() is not None:
                tail = (self.logdir / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"bench child {name} exited with {child.returncode}:\n{tail}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(predicate: Callable[[], Any], *, timeout: float, interval: float = 0.01, what: str = "a condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench: timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# ---------------------------------------------------------------------------
# oz0 fixtures: a workspace with an operator, counted queries
# ---------------------------------------------------------------------------


def bench_team(prefix: str = "bench") -> tuple[Any, Any]:
    """A fresh workspace and an operator member."""
    from django.contrib.auth.models import User

    from tenancy.models import Membership, Workspace

    tag = uuid.uuid4().hex[:8]
    workspace = Workspace.objects.create(slug=f"{prefix}-{tag}", name=f"bench {prefix}")
    user = User.objects.create_user(username=f"{prefix}-{tag}", password=uuid.uuid4().hex)
    Membership.objects.create(workspace=workspace, user=user, role="operator")
    return workspace, user


class QueryCounter:
    """Counts the SQL statements this process's default connection runs inside the block."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        self.count += 1
        return execute(sql, params, many, context)

    def __enter__(self) -> QueryCounter:
        from django.db import connection

        self._cm = connection.execute_wrapper(self)
        self._cm.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._cm.__exit__(*exc)


# ---------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------


def write_results(data: dict[str, Any]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = RESULTS_DIR / f"bench-{data['profile']}-{stamp}.json"
    text = json.dumps(data, indent=2, sort_keys=False, default=str)
    path.write_text(text + "\n")
    (RESULTS_DIR / "latest.json").write_text(text + "\n")
    return path


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}" if abs(value) >= 0.1 else f"{value:.3f}"
    return str(value)


def table(sections: dict[str, Section]) -> str:
    """The figures (median [min-max] unit) and the goals, as a plain-text table."""
    lines = []
    header = f"{'workload':<11} {'figure':<44} {'median':>11} {'min':>11} {'max':>11}  unit"
    lines += [header, "-" * len(header)]
    for name, section in sections.items():
        if section.skipped:
            lines.append(f"{name:<11} skipped: {section.skipped}")
            continue
        for figure, stat in section.figures.items():
            lines.append(
                f"{name:<11} {figure:<44} {_fmt(stat['median']):>11} {_fmt(stat['min']):>11} {_fmt(stat['max']):>11}  {stat['unit']}"
            )
    goals = [(name, g) for name, s in sections.items() for g in s.goals]
    if goals:
        lines += ["", f"{'goal':<56} {'target':>10} {'measured':>11}  verdict", "-" * 90]
        for name, goal in goals:
            verdict = {True: "met", False: "MISSED", None: "n/a"}[goal.met]
            lines.append(f"{(name + ': ' + goal.name)[:56]:<56} {goal.target:>10} {_fmt(goal.value):>11}  {verdict}")
    return "\n".join(lines)
