"""The JSON-lines harness, protocol version 1 (docs/harness-jsonl.md): a process that reads one JSON
object per line on stdin and writes one per line on stdout (logs on stderr only, lines at most 1 MiB).

oz0 sends `start`, then a `result` for each `call`, and `cancel` when the run stops; the harness
sends `call`s (registry tools, the built-ins `oz.fail` and `oz.ask`, the delegating built-ins it
lists) and ends with `done`. A run cancel sends `cancel`, then SIGTERM after a grace, then SIGKILL. A process that cannot start is
`harness_unavailable`; one that exits before `done` is `harness_crashed`; a line that is not a
protocol message is `harness_protocol_error`. Its stderr is kept on the task (words, redacted).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

from django.conf import settings

from runs.worker.harness.base import (
    HarnessCanceled,
    HarnessCrashed,
    HarnessError,
    HarnessProtocolError,
    HarnessSession,
    HarnessUnavailable,
)

PROTOCOL = 1
LINE_MAX = 1024 * 1024
STDERR_BUFFER = 64 * 1024
CANCEL_GRACE_SECONDS = 1.0
TERM_GRACE_SECONDS = 2.0
EXIT_WAIT_SECONDS = 2.0
# The variables a harness inherits; the worker's own (database URL, secret key) never reach it.
INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ")
_EOF = object()


# A bridge (runs/worker/harness/openai_agents_bridge.py) exits with this when it cannot load its agent.
UNAVAILABLE_EXIT = 69


def run(session: HarnessSession) -> Any:
    harness = session.harness
    return converse(session, harness.get("command") or [], harness.get("env") or {})


def converse(session: HarnessSession, command: Sequence[str], env: Mapping[str, str]) -> Any:
    """Run the job with a harness process speaking protocol v1 to its end; its `done` output."""
    channel = Channel.spawn(command, env)
    try:
        channel.send(session.start_message())
        while True:
            message = channel.receive(session)
            usage = message.get("usage") if isinstance(message.get("usage"), Mapping) else None
            requests = (usage or {}).get("requests", 1)
            session.bill(usage, calls=requests if isinstance(requests, int) and not isinstance(requests, bool) else 1)
            kind = message.get("type")
            if kind == "done":
                return message.get("output")
            if kind != "call":
                raise HarnessProtocolError(f"the harness sent a message of type {kind!r}; it sends `call` or `done`")
            call_id, tool, args = message.get("id"), message.get("tool"), message.get("args", {})
            if not isinstance(call_id, str | int) or isinstance(call_id, bool):
                raise HarnessProtocolError("a `call` needs an `id` (a string or an integer)")
            if not isinstance(args, Mapping):
                raise HarnessProtocolError(f"call {call_id!r}'s `args` is not an object")
            if tool == "oz.fail":
                session.fail(args.get("kind"), args.get("message"))
            result = session.ask(args.get("question")) if tool == "oz.ask" else session.call_tool(tool, args)
            channel.send(result.as_message(call_id))
    except HarnessCanceled:
        channel.cancel()
        raise
    except HarnessError as error:
        error.stderr = channel.stderr_text()
        raise
    finally:
        session.stderr = channel.stderr_text()
        channel.close()


class Channel:
    """The harness process and its three streams: lines out, lines in, stderr kept."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.lines: queue.Queue[Any] = queue.Queue()
        self._stderr = bytearray()
        self._readers = [
            threading.Thread(target=self._read_lines, args=(process.stdout,), daemon=True),
            threading.Thread(target=self._read_stderr, args=(process.stderr,), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @classmethod
    def spawn(cls, command: Sequence[str], env: Mapping[str, str]) -> Channel:
        if not command:
            raise HarnessUnavailable("the jsonl harness names no command")
        argv = [sys.executable if command[0] == "python" else command[0], *command[1:]]
        environment = {name: os.environ[name] for name in INHERITED_ENV if name in os.environ}
        environment.update({"PYTHONUNBUFFERED": "1", **env})
        try:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=environment,
                cwd=str(settings.BASE_DIR),
                start_new_session=True,  # its own process group: a kill reaches what it spawned too
            )
        except OSError as error:
            raise HarnessUnavailable(f"the harness command {command[0]!r} cannot be started: {error.strerror or error}") from None
        return cls(process)

    def _read_lines(self, stream: IO[bytes]) -> None:
        try:
            while True:
                line = stream.readline(LINE_MAX + 1)
                if not line:
                    break
                if len(line) > LINE_MAX:
                    self.lines.put(HarnessProtocolError(f"the harness sent a line longer than {LINE_MAX:,} bytes"))
                    return
                if line.strip():
                    self.lines.put(line)
        except (OSError, ValueError):
            pass
        self.lines.put(_EOF)

    def _read_stderr(self, stream: IO[bytes]) -> None:
        try:
            for chunk in iter(lambda: stream.read1(4096), b""):  # type: ignore[attr-defined]
                self._stderr.extend(chunk)
                if len(self._stderr) > STDERR_BUFFER:
                    del self._stderr[: len(self._stderr) - STDERR_BUFFER]
        except (OSError, ValueError):
            pass

    def stderr_text(self) -> str:
        return bytes(self._stderr).decode("utf-8", "replace").replace("\x00", "")

    def send(self, message: Mapping[str, Any]) -> None:
        data = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        try:
            assert self.process.stdin is not None
            self.process.stdin.write(data)
            self.process.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise self._crashed("stopped reading its input") from None

    def receive(self, session: HarnessSession) -> dict[str, Any]:
        while True:
            session.check_canceled()
            try:
                item = self.lines.get(timeout=0.05)
            except queue.Empty:
                continue
            if item is _EOF:
                raise self._crashed("closed its output before `done`")
            if isinstance(item, HarnessError):
                raise item
            try:
                message = json.loads(item)
            except ValueError:
                preview = item[:80].decode("utf-8", "replace")
                raise HarnessProtocolError(f"the harness sent a line that is not JSON: {preview!r}") from None
            if not isinstance(message, dict):
                raise HarnessProtocolError("the harness sent a JSON value that is not an object")
            return message

    def _crashed(self, what: str) -> HarnessError:
        try:
            code = self.process.wait(timeout=EXIT_WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            code = None
        for reader in self._readers[1:]:
            reader.join(timeout=1)
        tail = self.stderr_text().strip().splitlines()[-3:]
        exited = f"exited with code {code}" if code is not None else "is still running"
        said = f"; its stderr ends: {' | '.join(tail)[-500:]}" if tail else ""
        if code == UNAVAILABLE_EXIT:
            return HarnessUnavailable(f"the harness cannot load its agent{said}")
        return HarnessCrashed(f"the harness {what} ({exited}){said}")

    def cancel(self) -> None:
        """The run stops: a `cancel` line, then SIGTERM after a grace, then SIGKILL."""
        try:
            self.send({"type": "cancel"})
        except HarnessCrashed:
            pass
        if self._exited_within(CANCEL_GRACE_SECONDS):
            return
        self._signal(signal.SIGTERM)
        if self._exited_within(TERM_GRACE_SECONDS):
            return
        self._signal(signal.SIGKILL)

    def _exited_within(self, seconds: float) -> bool:
        try:
            self.process.wait(timeout=seconds)
            return True
        except subprocess.TimeoutExpired:
            return False

    def _signal(self, number: int) -> None:
        try:
            os.killpg(self.process.pid, number)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        """Whatever happened, no process is left behind: stdin closed, then a kill if it lingers."""
        try:
            if self.process.stdin is not None:
                self.process.stdin.close()
        except OSError:
            pass
        if not self._exited_within(0.5):
            self._signal(signal.SIGTERM)
            if not self._exited_within(TERM_GRACE_SECONDS):
                self._signal(signal.SIGKILL)
                self.process.wait(timeout=5)
        deadline = time.monotonic() + 1
        for reader in self._readers:
            reader.join(timeout=max(0.0, deadline - time.monotonic()))
