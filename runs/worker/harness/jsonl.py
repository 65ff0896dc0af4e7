"""The JSON-lines harness, protocol version 1 (docs/harness-jsonl.md): a process that reads one JSON
object per line on stdin and writes one per line on stdout (logs on stderr only, lines at most 1 MiB).

The process is a program the installer lists (`oz0agents.harness_programs`), named by the manifest's
`program:`, and runs confined (`sandbox.confine`). oz0 sends `start`, then a `result` for each
`call`, and `cancel` when the run stops; the harness sends `call`s (registry tools, the built-ins
`oz.fail`, `oz.ask` and `oz.approval`, the delegating built-ins it lists) and ends with `done`. A run
cancel sends `cancel`, then SIGTERM after a grace, then SIGKILL. A process that cannot start is
`harness_unavailable`; one that exits before `done` is `harness_crashed`; a line that is not a
protocol message is `harness_protocol_error`. Its stderr is kept on the task (words, redacted).
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from oz0agents.harness_programs import ProgramsFileError, program
from runs.worker.harness.base import (
    HarnessCanceled,
    HarnessCrashed,
    HarnessError,
    HarnessProtocolError,
    HarnessSession,
    HarnessUnavailable,
)
from runs.worker.harness.sandbox import Confined, SandboxUnavailable, confine, program_argv, reads_of

PROTOCOL = 1
LINE_MAX = 1024 * 1024
STDERR_BUFFER = 64 * 1024
CANCEL_GRACE_SECONDS = 1.0
TERM_GRACE_SECONDS = 2.0
EXIT_WAIT_SECONDS = 2.0
_EOF = object()


# The launcher, and a bridge that cannot load its agent, exit with this (EX_UNAVAILABLE).
UNAVAILABLE_EXIT = 69


def installed_program(session: HarnessSession) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of the program the manifest names, as the installer lists it now;
    the manifest's `env` first, the installer's over it."""
    harness = session.harness
    name = harness.get("program")
    if not isinstance(name, str):
        raise HarnessUnavailable(
            f"the {harness.get('kind')} harness names no program: oz0 runs only programs the installer lists in "
            "OZ0_HARNESS_PROGRAMS (a manifest's own `command:` is refused); register a version naming one"
        )
    try:
        found = program(name)
    except ProgramsFileError as broken:
        raise HarnessUnavailable(str(broken)) from None
    if found is None:
        raise HarnessUnavailable(f"the program {name!r} is no longer one the installer allows (OZ0_HARNESS_PROGRAMS)")
    return program_argv(found.argv), {**(harness.get("env") or {}), **found.env}


def run(session: HarnessSession) -> Any:
    argv, env = installed_program(session)
    return converse(session, argv, env, reads=reads_of(argv))


def confined(session: HarnessSession, argv: Sequence[str], env: Mapping[str, str], reads: Iterable[Path]) -> Confined:
    """The harness process's confinement; a machine that cannot confine it is `harness_unavailable`."""
    try:
        # The folder's name says whose it is, short enough for a unix socket's path inside it.
        label = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{str(session.run.pk)[:8]}-{session.task.key}")[:32]
        return confine(argv, {"PYTHONUNBUFFERED": "1", **env}, reads=reads, label=label)
    except SandboxUnavailable as error:
        raise HarnessUnavailable(f"the harness cannot be confined here: {error}") from None


def converse(session: HarnessSession, argv: Sequence[str], env: Mapping[str, str], *, reads: Iterable[Path] = ()) -> Any:
    """Run the job with a harness process speaking protocol v1 to its end; its `done` output."""
    if not argv:
        raise HarnessUnavailable("the harness names no program")
    channel = Channel.spawn(confined(session, argv, env, reads))
    session.stderr_source = channel.stderr_text
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
            if kind == "usage":
                continue  # tokens spent with no call to carry them (a bridge about to crash): billed above
            if kind != "call":
                raise HarnessProtocolError(f"the harness sent a message of type {kind!r}; it sends `call` or `done`")
            call_id, tool, args = message.get("id"), message.get("tool"), message.get("args", {})
            if not isinstance(call_id, str | int) or isinstance(call_id, bool):
                raise HarnessProtocolError("a `call` needs an `id` (a string or an integer)")
            if not isinstance(args, Mapping):
                raise HarnessProtocolError(f"call {call_id!r}'s `args` is not an object")
            if tool == "oz.fail":
                channel.settle_stderr()  # what it wrote before ending the job is kept on the round
                session.fail(args.get("kind"), args.get("message"))
            if tool == "oz.ask":
                result = session.ask(args.get("question"))
            elif tool == "oz.approval":
                result = session.approval(args.get("tool"), args.get("args", {}))
            else:
                result = session.call_tool(tool, args)
            channel.send(result.as_message(call_id))
    except HarnessCanceled:
        if session.timed_out.is_set():
            channel.kill()  # past its deadline: no `cancel` line, no grace
        else:
            channel.cancel()
        raise
    except HarnessError as error:
        channel.close()
        error.stderr = channel.stderr_text()
        raise
    finally:
        # Closed first: the stderr kept is all the process wrote, up to its end.
        channel.close()
        session.stderr = channel.stderr_text()


class Channel:
    """The harness process and its three streams: lines out, lines in, stderr kept."""

    def __init__(self, process: subprocess.Popen[bytes], confined: Confined) -> None:
        self.process = process
        self.confined = confined
        self.lines: queue.Queue[Any] = queue.Queue()
        self._stderr = bytearray()
        self._closed = False
        self._readers = [
            threading.Thread(target=self._read_lines, args=(process.stdout,), daemon=True),
            threading.Thread(target=self._read_stderr, args=(process.stderr,), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @classmethod
    def spawn(cls, confined: Confined) -> Channel:
        try:
            process = subprocess.Popen(
                confined.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=confined.env,
                close_fds=True,
                start_new_session=True,  # its own process group: a kill reaches what it spawned too
            )
        except OSError as error:
            confined.cleanup()
            raise HarnessUnavailable(f"the harness cannot be started: {error.strerror or error}") from None
        return cls(process, confined)

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

    def settle_stderr(self, quiet: float = 0.05, most: float = 0.5) -> None:
        """Wait (at most `most` seconds) until stderr has been quiet for `quiet` seconds: a line the
        harness wrote just before its last message is read before the round is reported."""
        deadline = time.monotonic() + most
        seen = -1
        while time.monotonic() < deadline and seen != len(self._stderr):
            seen = len(self._stderr)
            time.sleep(quiet)

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
        deadline = time.monotonic() + 1
        for reader in self._readers:
            reader.join(timeout=max(0.0, deadline - time.monotonic()))
        self.confined.cleanup()
