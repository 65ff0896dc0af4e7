"""A small process manager for `./oz0 up`: web, worker, session worker and beat in their own process
groups, their output prefixed with their names; a child that dies is started again with backoff
(and the person is told), the embedded PostgreSQL and Redis too; all stopped together on Ctrl-C."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from oz0cli import ROOT

# A child's restarts wait 1, 2, 4, ... seconds, at most this long; one that stayed up this long
# starts the count again; this many failures in a row, each up for less than that, and `up` gives up.
MAX_BACKOFF = 30.0
STEADY_SECONDS = 60.0
GIVE_UP_AFTER = 8


def backoff(failures: int) -> float:
    """The pause before restart number `failures` (1, 2, 4, ... seconds, at most MAX_BACKOFF)."""
    return min(MAX_BACKOFF, 2.0 ** max(0, failures - 1))


class StopFlag:
    """Set by a signal handler, read by the main loop. Not a threading.Event: its set() takes a
    lock that the main thread, interrupted by the signal inside Event.wait, may already hold, and
    the handler then waits on itself forever (a SIGTERM during `up` hung it)."""

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


class Service(Protocol):
    """An embedded service the supervisor watches (oz0cli.embedded)."""

    name: str

    def alive(self) -> bool: ...

    def restart(self, give_up: Callable[[], bool] = ...) -> None: ...


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    color: str
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    failures: int = 0  # exits in a row, each before it was up STEADY_SECONDS
    restart_at: float | None = None
    pass_fds: tuple[int, ...] = ()  # what it inherits (the web processes: the listening socket)


@dataclass
class Watched:
    service: Service
    failures: int = 0
    restart_at: float | None = None
    last_restart: float = field(default=float("-inf"))


class Supervisor:
    """Start children in their own process groups, prefix their output, restart the ones that die,
    stop them all together."""

    COLORS = ("36", "33", "35", "32", "34")

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.children: list[Child] = []
        self.services: list[Watched] = []
        self.stopping = StopFlag()
        self.width = 6
        self.lock = threading.Lock()
        self.color = sys.stdout.isatty()
        self.gave_up = False
        # How long the children get before each harder signal (see stop).
        self.stop_graces: tuple[tuple[float, signal.Signals], ...] = ((8.0, signal.SIGQUIT), (5.0, signal.SIGKILL))
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.stopping.is_set():  # a second Ctrl-C: no more patience
            for child in self.children:
                if child.process is not None:
                    self._kill(child.process, signal.SIGKILL)
        self.stopping.set()

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None, pass_fds: tuple[int, ...] = ()) -> None:
        color = self.COLORS[len(self.children) % len(self.COLORS)]
        child = Child(name, argv, {**self.env, **(env or {})}, color, pass_fds=pass_fds)
        self.children.append(child)
        self.width = max(self.width, len(name))
        self._spawn(child)

    def watch(self, service: Service) -> None:
        """Restart this embedded service (the same port, the same data) when it dies."""
        self.services.append(Watched(service))

    def child(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    def _spawn(self, child: Child) -> None:
        process = subprocess.Popen(
            child.argv,
            cwd=ROOT,
            env=child.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=child.pass_fds,
        )
        child.process, child.started_at, child.restart_at = process, time.monotonic(), None
        threading.Thread(target=self._pump, args=(child.name, child.color, process), daemon=True).start()

    def _pump(self, name: str, color: str, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        for raw in iter(process.stdout.readline, b""):
            self.line(name, raw.decode(errors="replace").rstrip("\n"), color)

    def line(self, name: str, text: str, color: str = "1") -> None:
        prefix = f"{time.strftime('%H:%M:%S')} {name:<{self.width}} |"
        if self.color:
            prefix = f"\x1b[{color}m{prefix}\x1b[0m"
        with self.lock:
            print(f"{prefix} {text}", flush=True)

    def wait(self) -> int:
        """Until a signal: restart what dies; then stop everyone. Returns the exit code: 0, or 1
        when a child kept dying and `up` gave up."""
        while not self.stopping.is_set():
            time.sleep(0.2)
            self.tend()
        self.stop()
        return 1 if self.gave_up else 0

    def tend(self) -> None:
        """One look at every child and service: restart what died, when its backoff is over."""
        for child in self.children:
            self._tend(child)
        for watched in self.services:
            self._tend_service(watched)

    def _tend(self, child: Child) -> None:
        now = time.monotonic()
        if child.restart_at is not None:
            if now >= child.restart_at and not self.stopping.is_set():
                self._spawn(child)
                self.line("oz0", f"{child.name} started again (restart {child.failures})")
            return
        if child.process is None or child.process.poll() is None:
            return
        code = child.process.returncode
        child.failures = 1 if now - child.started_at >= STEADY_SECONDS else child.failures + 1
        if child.failures > GIVE_UP_AFTER:
            self.line("oz0", f"{child.name} exited with code {code} {child.failures - 1} times in a row; giving up")
            self.gave_up = True
            self.stopping.set()
            return
        delay = backoff(child.failures)
        child.restart_at = now + delay
        self.line("oz0", f"{child.name} exited with code {code}; restarting it in {delay:.0f}s")

    def _tend_service(self, watched: Watched) -> None:
        now = time.monotonic()
        if watched.restart_at is None:
            if watched.service.alive():
                return
            watched.failures = 1 if now - watched.last_restart >= STEADY_SECONDS else watched.failures + 1
            delay = 0.0 if watched.failures == 1 else backoff(watched.failures - 1)
            watched.restart_at = now + delay
            self.line(
                "oz0", f"the embedded {watched.service.name} stopped; restarting it" + (f" in {delay:.0f}s" if delay else "")
            )
            return
        if now < watched.restart_at or self.stopping.is_set():
            return
        watched.restart_at, watched.last_restart = None, now
        try:
            watched.service.restart(give_up=self.stopping.is_set)
        except Exception as error:
            self.line("oz0", f"the embedded {watched.service.name} did not start again: {error}")
            return
        self.line("oz0", f"the embedded {watched.service.name} is running again")

    def stop(self) -> None:
        running = [c for c in self.children if c.process is not None]
        began = time.monotonic()
        self.line("oz0", "stopping " + ", ".join(c.name for c in running))
        processes = [c.process for c in running if c.process is not None]
        for process in processes:
            self._signal(process, signal.SIGTERM)  # the leader stops its own children (celery's pool)
        # A worker's warm shutdown waits for its running tasks; a demo tool sleeps for an
        # hour, so after a grace period the worker gets a cold shutdown (its message goes
        # back to the queue: acks_late), and anything still alive is killed.
        for grace, sig in self.stop_graces:
            deadline = time.monotonic() + grace
            for process in processes:
                try:
                    process.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            alive = [p for p in processes if p.poll() is None]
            if not alive:
                break
            self.line(
                "oz0",
                f"still running after {time.monotonic() - began:.0f}s: "
                + ", ".join(c.name for c in running if c.process in alive)
                + f"; sending {sig.name}",
            )
            for process in alive:
                (self._signal if sig == signal.SIGQUIT else self._kill)(process, sig)
        for process in processes:
            self._kill(process, signal.SIGKILL)  # stray grandchildren of an exited leader
            process.wait()
        self.line("oz0", f"stopped in {time.monotonic() - began:.1f}s")

    @staticmethod
    def _signal(process: subprocess.Popen[bytes], sig: int) -> None:
        if process.poll() is None:
            process.send_signal(sig)

    @staticmethod
    def _kill(process: subprocess.Popen[bytes], sig: int) -> None:
        try:
            os.killpg(process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def wait_for_web(host: str, port: int, supervisor: Supervisor, timeout: float, *, probe_seconds: float = 5.0) -> bool:
    """Until a web child answers HTTP (they may be restarted meanwhile), `up` is stopped, or `timeout`.
    An answer, not a connection: the listening socket is `up`'s own and takes connections into its
    backlog before any web process serves. Each probe waits `probe_seconds` for its answer: on a
    machine whose cores are all busy, a first /healthz (its database, Redis and worker checks) takes
    seconds, and a probe that gave up sooner would never see the web process answer."""
    webs = [child for child in supervisor.children if child.name == "web" or child.name.startswith("web-")]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if supervisor.stopping.is_set():
            return False
        supervisor.tend()
        if any(web.process is not None and web.process.poll() is None for web in webs) and answers(
            host, port, timeout=probe_seconds
        ):
            return True
        time.sleep(0.1)
    return False


def answers(host: str, port: int, *, timeout: float = 1.0) -> bool:
    """Whether something on host:port answers an HTTP request (any status) within `timeout` seconds."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", "/healthz")
        connection.getresponse().read()
        return True
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()
