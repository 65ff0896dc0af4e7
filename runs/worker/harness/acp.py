"""The ACP harness (F7): `harness: {acp: {program: NAME, env: {...}}}` is an agent speaking Zed's
Agent Client Protocol on its stdio, a program the installer lists; oz0 is the ACP client.

oz0 spawns the agent confined (`sandbox.confine`: the job's fresh folder is its working folder and
the session's `cwd`), `initialize`s it, opens a session whose MCP servers are one stdio server
named `oz0` (`acp_mcp_server.py`, which the agent starts inside its sandbox), and sends the job as
the `prompt`. The `oz0` server's tools (`fail`, `ask`, the registry tools) reach this worker over a
unix socket in the job's folder as JSON-lines protocol v1 calls, answered by the harness session:
the approval stage, the trace, and oz.fail into the kernel's one entry. A `session/request_permission`
crosses the approval stage too (`HarnessSession.approval`), and the person's decision comes back as
the agent's own allow or reject option. oz0 offers no file system or terminal methods. A run cancel
sends `session/cancel` (the turn must end `cancelled`), then SIGTERM and SIGKILL. The agent's
message chunks are the round's output.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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
from runs.worker.harness.jsonl import (
    CANCEL_GRACE_SECONDS,
    LINE_MAX,
    STDERR_BUFFER,
    TERM_GRACE_SECONDS,
    UNAVAILABLE_EXIT,
    confined,
    installed_program,
)
from runs.worker.harness.model_calls import record_model_use
from runs.worker.harness.sandbox import Confined, reads_of

try:
    import acp
    from acp.schema import EnvVariable, McpServerStdio
except ImportError as missing:  # the adapter loads; a job on it fails harness_unavailable
    raise ImportError(f"agent-client-protocol is not installed: {missing}") from None

MCP_SERVER = Path(__file__).with_name("acp_mcp_server.py")


class CallServer:
    """The worker's end of the `oz0` MCP server: a unix socket in the job's folder (which only the
    harness user and the worker reach), served by a thread (the harness session's calls are
    synchronous database work, kept off the ACP event loop)."""

    def __init__(self, session: HarnessSession, folder: Path) -> None:
        self.session = session
        self.path = str(folder / "oz0-calls.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        os.chmod(self.path, 0o666)  # the harness user connects; its folder is the user's alone
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


class OzClient:
    """What an ACP agent may ask of oz0: it streams its message, and asks permission for a tool call
    (decided by oz0's approval stage). oz0 offers no file system or terminal methods: the agent
    works in its own folder, and oz0's tools are on the `oz0` MCP server."""

    def __init__(self, session: HarnessSession) -> None:
        self.session = session
        self.text: list[str] = []
        self.canceled = False
        self.loading = False  # a loaded session's history, replayed: not the round's output

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        kind = getattr(update, "session_update", None)
        if kind == "agent_message_chunk" and not self.loading:
            content = getattr(update, "content", None)
            if getattr(content, "type", None) == "text":
                self.text.append(str(getattr(content, "text", "")))
        # usage_update reports the context window's fill, not tokens billed: the turn's usage is billed.

    async def request_permission(self, session_id: str, tool_call: Any, options: Any, **kwargs: Any) -> Any:
        """The agent asks before a tool call: the call (`acp.<kind>`, its title, input, locations and
        content) crosses the approval stage; approved, the agent's allow-once option (else its
        allow-always), denied, its reject option with the failure, labelled, in `_meta.oz0`."""
        name = f"acp.{getattr(tool_call, 'kind', None) or 'other'}"
        args = tool_call.model_dump(
            mode="json", by_alias=True, exclude_none=True, exclude={"tool_call_id", "status", "raw_output", "field_meta"}
        )
        try:
            answer = await asyncio.to_thread(_approval, self.session, name, args)
        except HarnessCanceled:
            self.canceled = True
            return {"outcome": {"outcome": "cancelled"}}
        kinds = {getattr(option, "kind", None): getattr(option, "option_id", None) for option in reversed(list(options))}
        if answer.ok:
            chosen = kinds.get("allow_once") or kinds.get("allow_always")
            if chosen is not None:
                return {"outcome": {"outcome": "selected", "optionId": chosen}}
            return {"outcome": {"outcome": "cancelled"}}
        meta = {"oz0": {"failure": answer.failure}}
        chosen = kinds.get("reject_once") or kinds.get("reject_always")
        if chosen is not None:
            return {"outcome": {"outcome": "selected", "optionId": chosen, "_meta": meta}, "_meta": meta}
        return {"outcome": {"outcome": "cancelled"}, "_meta": meta}

    def on_connect(self, conn: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        async def refused(*args: Any, **kwargs: Any) -> Any:
            raise acp.RequestError.method_not_found(name)

        return refused


def _approval(session: HarnessSession, name: str, args: dict[str, Any]) -> Any:
    try:
        return session.approval(name, args)
    finally:
        connection.close()


def run(session: HarnessSession) -> Any:
    argv, env = installed_program(session)
    jail = confined(session, argv, env, [*reads_of(argv), MCP_SERVER])
    calls = CallServer(session, jail.job_dir)
    try:
        return asyncio.run(_converse(session, calls, jail))
    finally:
        calls.close()
        jail.cleanup()


async def _converse(session: HarnessSession, calls: CallServer, jail: Confined) -> Any:
    client = OzClient(session)
    # Started by the agent inside its sandbox, with the worker's interpreter (mounted there).
    oz0_server = McpServerStdio(
        name="oz0",
        command=sys.executable,
        args=[str(MCP_SERVER), calls.path],
        env=[EnvVariable(name=k, value=v) for k, v in jail.env.items()],
    )
    argv = jail.argv
    try:
        spawned = acp.spawn_agent_process(client, argv[0], *argv[1:], env=jail.env, cwd=str(jail.job_dir))
        async with spawned as (conn, process):
            turn: asyncio.Future[Any] | None = None
            stderr = asyncio.ensure_future(_keep_stderr(process, session))
            try:
                offered = await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
                session_id = await _open_session(conn, client, session, offered, cwd=str(jail.job_dir), servers=[oz0_server])
                turn = asyncio.ensure_future(conn.prompt(session_id=session_id, prompt=[acp.text_block(session.prompt())]))
                while not turn.done():
                    await asyncio.wait([turn], timeout=0.05)
                    if turn.done():
                        break
                    if session.cancel.is_set() or calls.canceled.is_set() or calls.ended.is_set() or client.canceled:
                        if not session.timed_out.is_set():  # past its deadline it is stopped at once
                            await conn.cancel(session_id=session_id)
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
                raise await _not_started(process, session) or HarnessProtocolError(
                    f"the ACP agent answered an error: {error}"[:2000]
                ) from None
            except (ConnectionError, EOFError, asyncio.IncompleteReadError) as error:
                raise await _not_started(process, session) or HarnessCrashed(
                    f"the ACP agent went away: {type(error).__name__}: {error}"[:2000]
                ) from None
            finally:
                if process.returncode is None:
                    await _stop(process)
                _settle(turn)
                await asyncio.wait([stderr], timeout=1)
                _settle(stderr)
    except (FileNotFoundError, PermissionError) as error:
        raise HarnessUnavailable(f"the ACP agent cannot be started: {error.strerror or error}") from None
    if calls.error is not None:
        raise calls.error
    reason = getattr(response, "stop_reason", None)
    if reason == "cancelled":
        raise HarnessCanceled()
    usage = getattr(response, "usage", None)
    if usage is not None:
        # The prompt's turn is the one model use an ACP agent reports: its tokens and stop reason.
        tokens = {"input_tokens": getattr(usage, "input_tokens", 0), "output_tokens": getattr(usage, "output_tokens", 0)}
        record_model_use(session, {"usage": tokens, "finish": reason if isinstance(reason, str) else None})
    return "".join(client.text)


async def _open_session(
    conn: Any, client: OzClient, session: HarnessSession, offered: Any, *, cwd: str, servers: list[Any]
) -> str:
    """The ACP session the prompt goes to. A session of the round started again (a retry, a lost
    worker) loads the one an earlier session opened (`session/load`) when the agent offers it
    (`agentCapabilities.loadSession`), so the agent has its conversation back; the history it
    replays is not the round's output. Else, or when the agent cannot load it (a session it stored
    in a job folder that is gone), a new session. The session's id is kept on the round as its
    checkpoint (`{acp_session}`) for the next one."""
    earlier = ((session.journal.checkpoint or {}).get("state") or {}).get("acp_session")
    capabilities = getattr(offered, "agent_capabilities", None)
    if isinstance(earlier, str) and getattr(capabilities, "load_session", False):
        client.loading = True
        try:
            await conn.load_session(cwd=cwd, session_id=earlier, mcp_servers=servers)
        except acp.RequestError:
            pass  # the agent no longer has it: a new session
        else:
            await asyncio.to_thread(_noted, session, earlier, loaded=True)
            return earlier
        finally:
            client.loading = False
    opened = await conn.new_session(cwd=cwd, mcp_servers=servers)
    await asyncio.to_thread(_noted, session, str(opened.session_id), loaded=False)
    return str(opened.session_id)


def _noted(session: HarnessSession, session_id: str, *, loaded: bool) -> None:
    try:
        if loaded:
            session.resumed()  # `journal_resumed` in the trace: the session went on from the earlier one
        session.checkpoint({"acp_session": session_id})
    finally:
        connection.close()


async def _not_started(process: Any, session: HarnessSession) -> HarnessUnavailable | None:
    """The agent's program could not start (the launcher's EX_UNAVAILABLE, or a sandbox that
    cannot be set up here): unavailable, not a crash."""
    try:
        await asyncio.wait_for(process.wait(), timeout=TERM_GRACE_SECONDS)
    except TimeoutError:
        return None
    said = session.stderr.strip().splitlines()[-2:]
    if process.returncode == UNAVAILABLE_EXIT or (process.returncode == 1 and any(s.startswith("bwrap: ") for s in said)):
        return HarnessUnavailable(f"the ACP agent cannot be started: {' | '.join(said)[-500:]}")
    return None


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
