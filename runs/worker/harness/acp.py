"""The ACP harness (F7): `harness: {acp: {command: [...], env: {...}}}` is an agent speaking Zed's
Agent Client Protocol on its stdio; oz0 is the ACP client.

oz0 spawns the agent, `initialize`s it, opens a session whose MCP servers are one stdio server named
`oz0` (`acp_mcp_server.py`, which the agent starts), and sends the job as the `prompt`. The `oz0`
server's tools (`fail`, `ask`, the registry tools) reach this worker over a private unix socket as
JSON-lines protocol v1 calls, answered by the harness session: the approval stage, the trace, and
oz.fail into the kernel's one entry. A run cancel sends `session/cancel` (the turn must end
`cancelled`), then SIGTERM and SIGKILL. The agent's message chunks are the round's output.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

from runs.worker.harness.base import (
    HarnessCanceled,
    HarnessCrashed,
    HarnessError,
    HarnessProtocolError,
    HarnessSession,
    HarnessUnavailable,
    JobEnded,
)
from runs.worker.harness.jsonl import CANCEL_GRACE_SECONDS, INHERITED_ENV, LINE_MAX, STDERR_BUFFER, TERM_GRACE_SECONDS

try:
    import acp
    from acp.schema import EnvVariable, McpServerStdio
except ImportError as missing:  # the adapter loads; a job on it fails harness_unavailable
    raise ImportError(f"agent-client-protocol is not installed: {missing}") from None

MCP_SERVER = Path(__file__).with_name("acp_mcp_server.py")


class CallServer:
    """The worker's end of the `oz0` MCP server: a unix socket in a private folder, served by a thread
    (the harness session's calls are synchronous database work, kept off the ACP event loop)."""

    def __init__(self, session: HarnessSession) -> None:
        self.session = session
        self.folder = tempfile.mkdtemp(prefix="oz0-acp-")
        self.path = os.path.join(self.folder, "calls.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(4)
        self.listener.settimeout(0.1)
        self.ended = threading.Event()
        self.canceled = threading.Event()
        self.error: HarnessError | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="oz0-acp-calls", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    peer, _ = self.listener.accept()
                except TimeoutError:
                    continue
                except OSError:
                    return
                threading.Thread(target=self._answer, args=(peer,), daemon=True).start()
        finally:
            connection.close()

    def _answer(self, peer: socket.socket) -> None:
        stream = peer.makefile("rwb")
        try:
            while not self._stop.is_set():
                line = stream.readline(LINE_MAX + 1)
                if not line:
                    return
                reply = self._reply(json.loads(line))
                if reply is None:
                    return
                stream.write(json.dumps(reply).encode() + b"\n")
                stream.flush()
        except (OSError, ValueError):
            return
        finally:
            connection.close()
            peer.close()

    def _reply(self, message: Mapping[str, Any]) -> dict[str, Any] | None:
        if message.get("type") == "hello":
            return self.session.start_message()
        call_id, tool, args = message.get("id"), message.get("tool"), message.get("args") or {}
        try:
            if tool == "oz.fail":
                self.session.fail(args.get("kind"), args.get("message"))
            result = self.session.ask(args.get("question")) if tool == "oz.ask" else self.session.call_tool(tool, args)
        except JobEnded:
            self.ended.set()
            return {"type": "result", "id": call_id, "ok": True, "value": "oz0 ended the job"}
        except HarnessCanceled:
            self.canceled.set()
            return None
        return result.as_message(call_id if isinstance(call_id, str | int) else "")

    def close(self) -> None:
        self._stop.set()
        self.listener.close()
        self._thread.join(timeout=2)
        try:
            os.unlink(self.path)
            os.rmdir(self.folder)
        except OSError:
            pass


class OzClient:
    """What an ACP agent may ask of oz0: it streams its message; oz0 offers nothing else
    (files, terminals and permissions go through the `oz0` MCP server's tools, never around them)."""

    def __init__(self, session: HarnessSession) -> None:
        self.session = session
        self.text: list[str] = []

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        kind = getattr(update, "session_update", None)
        if kind == "agent_message_chunk":
            content = getattr(update, "content", None)
            if getattr(content, "type", None) == "text":
                self.text.append(str(getattr(content, "text", "")))
        # usage_update reports the context window's fill, not tokens billed: the turn's usage is billed.

    async def request_permission(self, session_id: str, tool_call: Any, options: Any, **kwargs: Any) -> Any:
        return {"outcome": {"outcome": "cancelled"}}

    def on_connect(self, conn: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        async def refused(*args: Any, **kwargs: Any) -> Any:
            raise acp.RequestError.method_not_found(name)

        return refused


def run(session: HarnessSession) -> Any:
    harness = session.harness
    command = list(harness.get("command") or [])
    if not command:
        raise HarnessUnavailable("the acp harness names no command")
    argv = [sys.executable if command[0] == "python" else command[0], *command[1:]]
    environment = {name: os.environ[name] for name in INHERITED_ENV if name in os.environ}
    environment.update({"PYTHONUNBUFFERED": "1", **(harness.get("env") or {})})
    calls = CallServer(session)
    try:
        return asyncio.run(_converse(session, calls, argv, environment))
    finally:
        calls.close()


async def _converse(session: HarnessSession, calls: CallServer, argv: list[str], environment: dict[str, str]) -> Any:
    client = OzClient(session)
    oz0_server = McpServerStdio(
        name="oz0",
        command=sys.executable,
        args=[str(MCP_SERVER), calls.path],
        env=[EnvVariable(name=k, value=v) for k, v in environment.items()],
    )
    try:
        spawned = acp.spawn_agent_process(client, argv[0], *argv[1:], env=environment, cwd=str(settings.BASE_DIR))
        async with spawned as (conn, process):
            turn: asyncio.Future[Any] | None = None
            stderr = asyncio.ensure_future(_keep_stderr(process, session))
            try:
                await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
                opened = await conn.new_session(cwd=str(settings.BASE_DIR), mcp_servers=[oz0_server])
                turn = asyncio.ensure_future(conn.prompt(session_id=opened.session_id, prompt=[acp.text_block(session.prompt())]))
                while not turn.done():
                    await asyncio.wait([turn], timeout=0.05)
                    if turn.done():
                        break
                    if session.cancel.is_set() or calls.canceled.is_set() or calls.ended.is_set():
                        await conn.cancel(session_id=opened.session_id)
                        await asyncio.wait([turn], timeout=CANCEL_GRACE_SECONDS)
                        await _stop(process)
                        if calls.ended.is_set():
                            raise JobEnded()
                        raise HarnessCanceled()
                if calls.ended.is_set():
                    raise JobEnded()
                response = turn.result()
            except (HarnessCanceled, JobEnded):
                raise
            except acp.RequestError as error:
                raise HarnessProtocolError(f"the ACP agent answered an error: {error}"[:2000]) from None
            except (ConnectionError, EOFError, asyncio.IncompleteReadError) as error:
                raise HarnessCrashed(f"the ACP agent went away: {type(error).__name__}: {error}"[:2000]) from None
            finally:
                if process.returncode is None:
                    await _stop(process)
                _settle(turn)
                await asyncio.wait([stderr], timeout=1)
                _settle(stderr)
    except (FileNotFoundError, PermissionError) as error:
        raise HarnessUnavailable(f"the ACP agent {argv[0]!r} cannot be started: {error.strerror or error}") from None
    if calls.error is not None:
        raise calls.error
    reason = getattr(response, "stop_reason", None)
    if reason == "cancelled":
        raise HarnessCanceled()
    usage = getattr(response, "usage", None)
    if usage is not None:
        session.bill({"input_tokens": getattr(usage, "input_tokens", 0), "output_tokens": getattr(usage, "output_tokens", 0)})
    return "".join(client.text)


async def _keep_stderr(process: Any, session: HarnessSession) -> None:
    """The agent's stderr, its last STDERR_BUFFER bytes kept on the task (words, redacted as any)."""
    kept = bytearray()
    while process.stderr is not None:
        chunk = await process.stderr.read(4096)
        if not chunk:
            return
        kept.extend(chunk)
        del kept[:-STDERR_BUFFER]
        session.stderr = kept.decode("utf-8", "replace").replace("\x00", "")


def _settle(turn: asyncio.Future[Any] | None) -> None:
    """A turn the agent never finished (a cancel, oz.fail, a crash) is dropped, its error read."""
    if turn is None:
        return
    if not turn.done():
        turn.cancel()
    elif not turn.cancelled():
        turn.exception()


async def _stop(process: Any) -> None:
    """SIGTERM after the cancel's grace, then SIGKILL: no agent process is left behind."""
    if process.returncode is not None:
        return
    try:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), timeout=TERM_GRACE_SECONDS)
    except (TimeoutError, ProcessLookupError):
        try:
            process.kill()
            await process.wait()
        except ProcessLookupError:
            pass
