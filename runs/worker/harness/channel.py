"""A JSON-lines harness process and its three streams (runs/worker/harness/jsonl.py): lines out, lines
in, stderr kept. No thread of its own: the session's thread reads the pipes when it waits for a
line (`pump`), and while the session is released (runs/worker/harness/keeper.py: waiting on a
person, its thread given back) the keeper's event loop reads them (`read_ready`), so a waiting
session holds a process and two pipes, never a thread."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, cast

from runs.worker.harness.base import (
    HarnessCrashed,
    HarnessError,
    HarnessProtocolError,
    HarnessSession,
    HarnessUnavailable,
)
from runs.worker.harness.sandbox import Confined

LINE_MAX = 1024 * 1024
# The most a harness's stdout may hold that oz0 has not read yet (lines waiting in the channel).
# A session driven by a thread reads each line as it comes; a released one (waiting on a person,
# its pipes read by the keeper) reads nothing until the answer, so a harness writing on meanwhile
# would fill the worker's memory: past this cap it is ended, `harness_protocol_error`.
UNREAD_MAX = 2 * LINE_MAX
STDERR_BUFFER = 64 * 1024
CANCEL_GRACE_SECONDS = 1.0
TERM_GRACE_SECONDS = 2.0
EXIT_WAIT_SECONDS = 2.0
# The launcher, and a bridge that cannot load its agent, exit with this (EX_UNAVAILABLE).
UNAVAILABLE_EXIT = 69
READ_CHUNK = 64 * 1024
_EOF = object()
_spawner_pool: ThreadPoolExecutor | None = None
_spawner_lock = threading.Lock()


def _spawner() -> ThreadPoolExecutor:
    """The thread that starts every harness process of this worker (see `Channel.spawn`)."""
    global _spawner_pool
    with _spawner_lock:
        if _spawner_pool is None:
            _spawner_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="oz0-harness-spawner")
        return _spawner_pool


class Channel:
    """The harness process and its three streams: lines out, lines in, stderr kept."""

    def __init__(self, process: subprocess.Popen[bytes], confined: Confined) -> None:
        self.process = process
        self.confined = confined
        self.lines: deque[Any] = deque()
        self._unread = 0  # the bytes of the lines in `lines`
        self._partial = bytearray()
        self._stderr = bytearray()
        self._closed = False
        assert process.stdout is not None and process.stderr is not None
        self.out_fd = process.stdout.fileno()
        self.err_fd = process.stderr.fileno()
        self.open_fds = {self.out_fd, self.err_fd}
        for fd in self.open_fds:
            os.set_blocking(fd, False)
        self._selector = selectors.DefaultSelector()
        for fd in self.open_fds:
            self._selector.register(fd, selectors.EVENT_READ)

    @classmethod
    def spawn(cls, confined: Confined) -> Channel:
        popen = partial(
            subprocess.Popen,
            confined.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=confined.env,
            close_fds=True,
            start_new_session=True,  # its own process group: a kill reaches what it spawned too
        )
        try:
            # From the spawner's thread, which lives as long as the worker: the sandbox ends its
            # process when the thread that started it ends (bwrap --die-with-parent, a parent-death
            # signal), and a released session's process outlives the thread it started on.
            process = cast("subprocess.Popen[bytes]", _spawner().submit(popen).result())
        except OSError as error:
            confined.cleanup()
            raise HarnessUnavailable(f"the harness cannot be started: {error.strerror or error}") from None
        return cls(process, confined)

    def read_ready(self, fd: int) -> bool:
        """Read what the pipe `fd` holds now (the session's thread or the keeper's loop, never both
        at once); False once it reached its end."""
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return True
        except OSError:
            data = b""
        if not data:
            self._ended(fd)
            return False
        if fd == self.out_fd:
            self._lines_from(data)
        else:
            self._stderr.extend(data)
            if len(self._stderr) > STDERR_BUFFER:
                del self._stderr[: len(self._stderr) - STDERR_BUFFER]
        return True

    def _lines_from(self, data: bytes) -> None:
        if self.out_fd not in self.open_fds:
            return  # past a line too long: nothing more is read from it
        self._partial.extend(data)
        while True:
            end = self._partial.find(b"\n")
            if end < 0:
                if len(self._partial) > LINE_MAX:
                    self._too_long()
                return
            line = bytes(self._partial[: end + 1])
            del self._partial[: end + 1]
            if len(line) > LINE_MAX:
                self._too_long()
                return
            if line.strip():
                self.lines.append(line)
                self._unread += len(line)
                if self._unread > UNREAD_MAX:
                    self._flooded()
                    return

    def _too_long(self) -> None:
        self.lines.append(HarnessProtocolError(f"the harness sent a line longer than {LINE_MAX:,} bytes"))
        self._partial.clear()
        self._drop(self.out_fd)

    def _flooded(self) -> None:
        self.lines.append(
            HarnessProtocolError(
                f"the harness wrote more than {UNREAD_MAX:,} bytes on stdout that oz0 had not read yet "
                "(while it waited on a person's answer): it is ended"
            )
        )
        self._partial.clear()
        self._drop(self.out_fd)

    def ended_early(self) -> HarnessError | None:
        """What ended a released session's harness before the answer it waits for could be sent:
        a protocol error it caused (a line too long, its output flooded) or its output closed."""
        for item in self.lines:
            if isinstance(item, HarnessError):
                return item
            if item is _EOF:
                return self._crashed("closed its output while it waited on a person's answer")
        return None

    def _ended(self, fd: int) -> None:
        if fd == self.out_fd and fd in self.open_fds:
            if self._partial.strip():
                self.lines.append(bytes(self._partial))
                self._unread += len(self._partial)
            self._partial.clear()
            self.lines.append(_EOF)
        self._drop(fd)

    def _drop(self, fd: int) -> None:
        if fd in self.open_fds:
            self.open_fds.discard(fd)
            try:
                self._selector.unregister(fd)
            except (KeyError, ValueError):
                pass

    def pump(self, timeout: float) -> None:
        """Wait at most `timeout` seconds for either pipe, and read what they hold."""
        if not self.open_fds:
            time.sleep(timeout)
            return
        for key, _ in self._selector.select(timeout):
            self.read_ready(int(key.fd))

    def settle_stderr(self, quiet: float = 0.05, most: float = 0.5) -> None:
        """Wait (at most `most` seconds) until stderr has been quiet for `quiet` seconds: a line the
        harness wrote just before its last message is read before the round is reported."""
        deadline = time.monotonic() + most
        seen = -1
        while time.monotonic() < deadline and seen != len(self._stderr):
            seen = len(self._stderr)
            self.pump(quiet)

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
            if not self.lines:
                self.pump(0.05)
                continue
            item = self.lines.popleft()
            if isinstance(item, bytes):
                self._unread -= len(item)
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

    def _drain(self, most: float = 1.0) -> None:
        """Read the pipes to their ends (the process is gone), for at most `most` seconds."""
        deadline = time.monotonic() + most
        while self.open_fds and time.monotonic() < deadline:
            self.pump(0.05)

    def _crashed(self, what: str) -> HarnessError:
        try:
            code = self.process.wait(timeout=EXIT_WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            code = None
        self._drain()
        tail = self.stderr_text().strip().splitlines()[-3:]
        exited = f"exited with code {code}" if code is not None else "is still running"
        said = f"; its stderr ends: {' | '.join(tail)[-500:]}" if tail else ""
        if code == UNAVAILABLE_EXIT:
            return HarnessUnavailable(f"the harness cannot start or load its agent{said}")
        if code == 1 and any(line.startswith("bwrap: ") for line in tail):
            return HarnessUnavailable(f"the harness's sandbox cannot start here{said}")
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

    def kill(self) -> None:
        """The round's deadline passed: its process group is killed at once."""
        self._signal(signal.SIGKILL)
        self._exited_within(EXIT_WAIT_SECONDS)

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
        if self._closed:
            return
        self._closed = True
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
        self._drain()
        self._selector.close()
        for stream in (self.process.stdout, self.process.stderr):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        self.confined.cleanup()
