"""A small process manager for `./oz0 up`: web, worker and beat in their own process groups,
their output prefixed with their names, all stopped together when one exits or on Ctrl-C."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

from oz0cli import ROOT


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


class Supervisor:
    """Start children in their own process groups, prefix their output, stop them all together."""

    COLORS = ("36", "33", "35", "32", "34")

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.children: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.stopping = StopFlag()
        self.width = 6
        self.lock = threading.Lock()
        self.color = sys.stdout.isatty()
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.stopping.is_set():  # a second Ctrl-C: no more patience
            for _, process in self.children:
                self._kill(process, signal.SIGKILL)
        self.stopping.set()

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        process = subprocess.Popen(
            argv,
            cwd=ROOT,
            env={**self.env, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        color = self.COLORS[len(self.children) % len(self.COLORS)]
        self.children.append((name, process))
        self.width = max(self.width, len(name))
        threading.Thread(target=self._pump, args=(name, color, process), daemon=True).start()

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
        """Until a signal or a child's exit; then stop everyone. Returns the exit code."""
        code = 0
        while not self.stopping.is_set():
            time.sleep(0.2)
            for name, process in self.children:
                if process.poll() is not None:
                    self.line("oz0", f"{name} exited with code {process.returncode}; stopping the others")
                    code = 1
                    self.stopping.set()
                    break
        self.stop()
        return code

    def stop(self) -> None:
        self.line("oz0", "stopping " + ", ".join(name for name, _ in self.children))
        for _, process in self.children:
            self._signal(process, signal.SIGTERM)  # the leader stops its own children (celery's pool)
        # A worker's warm shutdown waits for its running tasks; a demo tool sleeps for an
        # hour, so after a grace period the worker gets a cold shutdown (its message goes
        # back to the queue: acks_late), and anything still alive is killed.
        for grace, sig in ((8.0, signal.SIGQUIT), (5.0, signal.SIGKILL)):
            deadline = time.monotonic() + grace
            for _, process in self.children:
                try:
                    process.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            alive = [(n, p) for n, p in self.children if p.poll() is None]
            if not alive:
                break
            for _, process in alive:
                (self._signal if sig == signal.SIGQUIT else self._kill)(process, sig)
        for _, process in self.children:
            self._kill(process, signal.SIGKILL)  # stray grandchildren of an exited leader
            process.wait()
        self.line("oz0", "stopped")

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


def wait_for_port(host: str, port: int, supervisor: Supervisor, timeout: float) -> bool:
    process = supervisor.children[0][1]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None or supervisor.stopping.is_set():
            return False
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False
