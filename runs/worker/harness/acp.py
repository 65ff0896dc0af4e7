"""The ACP harness (F7): `harness: {acp: {program: NAME, env: {...}}}` is an agent speaking Zed's
Agent Client Protocol on its stdio, a program the installer lists; oz0 is the ACP client.

oz0 spawns the agent confined (`sandbox.confine`: the round's kept folder is its working folder and
the session's `cwd`), `initialize`s it, opens a session whose MCP servers are one stdio server
named `oz0` (`acp_mcp_server.py`, which the agent starts inside its sandbox), and sends the job as
the `prompt`. The `oz0` server's tools (`fail`, `ask`, the registry tools) reach this worker over a
unix socket in the job's folder as JSON-lines protocol v1 calls, answered by the harness session:
the approval stage, the trace, and oz.fail into the kernel's one entry. A `session/request_permission`
crosses the approval stage too (`HarnessSession.approval`), and the person's decision comes back as
the agent's own allow or reject option. oz0 offers no file system or terminal methods. A run cancel
sends `session/cancel` (the turn must end `cancelled`; before a permission request or MCP call it
stopped is answered), then SIGTERM and SIGKILL. The agent's
message chunks are the round's output (at most OUTPUT_MAX bytes).

The conversation is served by the session worker's keeper loop, not by the session's thread
(`Conversation`), so a session waiting on a person past the park clock is released like a
JSON-lines one: no thread held while it waits (issue 29).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast

from django.db import connection

from runs.worker.harness.base import (
    CallResult,
    HarnessCanceled,
    HarnessCrashed,
    HarnessProtocolError,
    HarnessReleased,
    HarnessSession,
    HarnessUnavailable,
    JobEnded,
    refused,
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
from runs.worker.harness.keeper import Released, keeper
from runs.worker.harness.model_calls import record_model_use
from runs.worker.harness.sandbox import Confined, reads_of

try:
    import acp
    from acp.schema import EnvVariable, McpServerStdio
except ImportError as missing:  # the adapter loads; a job on it fails harness_unavailable
    raise ImportError(f"agent-client-protocol is not installed: {missing}") from None

log = logging.getLogger(__name__)
T = TypeVar("T")

MCP_SERVER = Path(__file__).with_name("acp_mcp_server.py")
# How often an active conversation looks whether its session must stop (a cancel, the deadline).
WATCH_SECONDS = 0.05
# The most calls of one agent whose database work runs at once, each in a thread of its own (the
# others wait their turn): an agent cannot make the worker start threads without end.
CALLS_AT_ONCE = 8
# The most message text an agent may stream as the round's output (a JSON-lines `done` line's cap).
OUTPUT_MAX = LINE_MAX


class Conversation:
    """An ACP session, served by the session worker's keeper loop (runs/worker/harness/keeper.py)
    from its start: the agent's process and pipes, the ACP connection, and the `oz0` MCP server's
    unix socket in the job's folder (which only the harness user and the worker reach). The
    session's thread only waits for its end (`outcome`); each call's database work, which may wait
    on a person, runs in a thread of its own while it lasts (`call`).

    A wait on a person past OZ0_SESSION_PARK_SECONDS releases the session (issue 29: waits hold
    nothing), as a JSON-lines one is: the call's thread ends, the session's thread goes back to its
    worker (`let_go`), and the conversation waits on the loop, holding no thread, until the keeper
    gives it a thread again (`Released.resume`: the call was decided, the run stops, or the
    conversation ended meanwhile). Only a conversation with one call in flight is released."""

    def __init__(self, session: HarnessSession, jail: Confined) -> None:
        self.session = session
        self.jail = jail
        self.keeper = keeper()
        self.loop = self.keeper.loop
        self.client = OzClient(self)
        self.socket_path = str(jail.job_dir / "oz0-calls.sock")
        # The future the thread holding the session waits on besides the end: set when it is let go.
        self.let_go: concurrent.futures.Future[HarnessReleased] = concurrent.futures.Future()
        self.ended: concurrent.futures.Future[Any] | None = None
        self.task: asyncio.Task[Any] | None = None
        # (The loop's.) Calls whose database work is in flight; whether the session is released now.
        self.inflight = 0
        self.released = False
        self.answered: asyncio.Future[None] | None = None
        self.attention: asyncio.Event | None = None
        self.calls_at_once: asyncio.Semaphore | None = None
        self.canceled = False  # a call was stopped by a cancel
        self.job_ended = False  # oz.fail ended the job
        self.finished = False  # the conversation ended: a released call is not taken up again
        # The ACP connection and session once opened, and whether `session/cancel` went to it.
        self.conn: Any = None
        self.session_id: str | None = None
        self.cancel_sent = False

    def run(self) -> Any:
        """(The session's thread.) Start the conversation on the loop; its output, or
        `HarnessReleased` when the session is released."""
        let_go = self.let_go = concurrent.futures.Future()
        self.ended = asyncio.run_coroutine_threadsafe(self._converse(), self.loop)
        return self.outcome(let_go)

    def outcome(self, let_go: concurrent.futures.Future[HarnessReleased]) -> Any:
        """Wait for the conversation's end, or for this thread to be let go (the session released)."""
        assert self.ended is not None
        concurrent.futures.wait([self.ended, let_go], return_when=concurrent.futures.FIRST_COMPLETED)
        if let_go.done():
            raise let_go.result()
        return self.ended.result()

    def resume(self) -> Any:
        """(The keeper's new thread.) Hold the session again: the call goes on from its answer."""
        let_go = self.let_go = concurrent.futures.Future()
        self.loop.call_soon_threadsafe(self._held)
        return self.outcome(let_go)

    def stop(self) -> None:
        """End the conversation, its process with it, reporting nothing (a lost worker's stand-in)."""
        if self.task is not None:
            self.loop.call_soon_threadsafe(self.task.cancel)

    def _held(self) -> None:
        self.released = False
        if self.attention is not None:
            self.attention.set()
        if self.answered is not None and not self.answered.done():
            self.answered.set_result(None)

    async def call(self, work: Callable[[], T]) -> T:
        """Run a call's database work in a thread of its own. Waiting on a person past the park clock
        it is released (when it is the only call in flight): its thread ends, the session's is let
        go, and it waits here, holding none, until the keeper gives it one again; then its answer."""
        assert self.calls_at_once is not None
        async with self.calls_at_once:
            return await self._call(work)

    async def _call(self, work: Callable[[], T]) -> T:
        self.inflight += 1
        self.session.releases = self.inflight == 1
        try:
            try:
                return await _in_thread(work)
            except HarnessReleased as waiting:
                await self._released(waiting)
                return cast(T, await _in_thread(partial(self.session.answer, waiting.key)))
        finally:
            self.inflight -= 1
            self.session.releases = self.inflight == 1

    async def _released(self, waiting: HarnessReleased) -> None:
        self.answered = self.loop.create_future()
        self.released = True
        self.keeper.keep(Released(self.session, key=waiting.key, waited=waiting.waited, resume=self.resume, stop=self.stop))
        self.let_go.set_result(waiting)  # the session's thread goes back to its worker
        await self.answered

    async def _converse(self) -> Any:
        self.task = asyncio.current_task()
        self.attention = asyncio.Event()
        self.calls_at_once = asyncio.Semaphore(CALLS_AT_ONCE)
        try:
            os.unlink(self.socket_path)  # a socket an earlier session of the round left in its kept folder
        except FileNotFoundError:
            pass
        try:
            server = await asyncio.start_unix_server(self._serve_calls, path=self.socket_path, limit=LINE_MAX + 1)
        except OSError as error:
            raise HarnessUnavailable(f"the oz0 MCP server's socket cannot be opened: {error.strerror or error}") from None
        try:
            # The harness user connects; its folder is the user's alone. Never through a link: the
            # folder is kept across sessions, and what a process of an earlier one put there is not
            # followed (a symlink in its place fails the session instead).
            os.chmod(self.socket_path, 0o666, follow_symlinks=False)
        except (OSError, NotImplementedError):
            server.close()
            raise HarnessUnavailable("the oz0 MCP server's socket was replaced in the job's folder") from None
        try:
            return await self._talk()
        finally:
            server.close()
            self.finished = True
            if self.answered is not None and not self.answered.done():
                self.answered.cancel()  # the call it was released on ends with it: no thread waits on
            if self.released:
                # It ended while released (its process died, it flooded its output): a thread
                # reports it now, without waiting for the decision.
                self.keeper.wake(self.session.claimed.claim)
            self.jail.cleanup()

    async def _serve_calls(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection of the `oz0` MCP server: JSON-lines protocol v1 calls, answered in order."""
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                message = json.loads(line)
                reply = await self._reply(message) if isinstance(message, dict) else None
                if reply is None:
                    return
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
        except (OSError, ValueError, asyncio.IncompleteReadError):
            return
        except Exception:
            log.exception("an ACP session's call failed in the worker")
        finally:
            writer.close()

    async def _reply(self, message: Mapping[str, Any]) -> dict[str, Any] | None:
        session = self.session
        if message.get("type") == "hello":
            return await self.call(session.start_message)
        call_id, tool, args = message.get("id"), message.get("tool"), message.get("args") or {}
        call_id = call_id if isinstance(call_id, str | int) else ""
        if not isinstance(args, Mapping):
            return refused("the call's args are not an object").as_message(call_id)

        def made() -> CallResult:
            if tool == "oz.fail":
                session.fail(args.get("kind"), args.get("message"))
            return session.ask(args.get("question")) if tool == "oz.ask" else session.call_tool(tool, args)

        try:
            result = await self.call(made)
        except JobEnded:
            self.job_ended = True
            return {"type": "result", "id": call_id, "ok": True, "value": "oz0 ended the job"}
        except HarnessCanceled:
            self.canceled = True
            await self.cancel_turn()
            return None
        return result.as_message(call_id)

    async def cancel_turn(self) -> None:
        """Send `session/cancel`, once, before what the agent awaits is answered as cancelled (ACP:
        the client cancels the turn, then answers its pending permission requests `cancelled`): an
        agent learns of the cancel from the notification, never only from an answer it could take
        for a person's dismissal and go on. Past its deadline the agent is stopped without one."""
        if self.cancel_sent or self.conn is None or self.session_id is None or self.session.timed_out.is_set():
            return
        self.cancel_sent = True
        try:
            await self.conn.cancel(session_id=self.session_id)
        except (ConnectionError, OSError):
            pass  # the agent is gone: its end is read where its turn is awaited

    def _stopping(self) -> bool:
        return self.session.cancel.is_set() or self.canceled or self.job_ended or self.client.canceled

    async def _talk(self) -> Any:
        session, client, jail = self.session, self.client, self.jail
        # Started by the agent inside its sandbox, with the worker's interpreter (mounted there).
        oz0_server = McpServerStdio(
            name="oz0",
            command=sys.executable,
            args=[str(MCP_SERVER), self.socket_path],
            env=[EnvVariable(name=k, value=v) for k, v in jail.env.items()],
        )
        argv = jail.argv
        assert self.attention is not None
        try:
            spawned = acp.spawn_agent_process(client, argv[0], *argv[1:], env=jail.env, cwd=str(jail.job_dir))
            async with spawned as (conn, process):
                turn: asyncio.Future[Any] | None = None
                stderr = asyncio.ensure_future(_keep_stderr(process, session))
                try:
                    offered = await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
                    session_id = await _open_session(conn, client, self, offered, cwd=str(jail.job_dir), servers=[oz0_server])
                    self.conn, self.session_id = conn, session_id
                    turn = asyncio.ensure_future(conn.prompt(session_id=session_id, prompt=[acp.text_block(session.prompt())]))
                    while not turn.done():
                        if self.released and not client.flooded:
                            # Released: nothing to watch until a thread holds it again (or its turn ends).
                            heard = asyncio.ensure_future(self.attention.wait())
                            try:
                                await asyncio.wait([turn, heard], return_when=asyncio.FIRST_COMPLETED)
                            finally:
                                heard.cancel()
                            self.attention.clear()
                            continue
                        await asyncio.wait([turn], timeout=WATCH_SECONDS)
                        if turn.done():
                            break
                        if client.flooded:
                            await _stop(process)
                            raise HarnessProtocolError(
                                f"the ACP agent streamed more than {OUTPUT_MAX:,} bytes of message text: it is ended"
                            )
                        if self._stopping():
                            if not session.timed_out.is_set():  # past its deadline it is stopped at once
                                await self.cancel_turn()
                                await asyncio.wait([turn], timeout=CANCEL_GRACE_SECONDS)
                            await _stop(process)
                            if self.job_ended:
                                raise JobEnded()
                            raise HarnessCanceled()
                    if self.job_ended:
                        raise JobEnded()
                    response = turn.result()
                except (HarnessCanceled, JobEnded, HarnessProtocolError):
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
        reason = getattr(response, "stop_reason", None)
        if reason == "cancelled":
            raise HarnessCanceled()
        usage = getattr(response, "usage", None)
        if usage is not None:
            # The prompt's turn is the one model use an ACP agent reports: its tokens and stop reason.
            tokens = {"input_tokens": getattr(usage, "input_tokens", 0), "output_tokens": getattr(usage, "output_tokens", 0)}
            record_model_use(session, {"usage": tokens, "finish": reason if isinstance(reason, str) else None})
        return "".join(client.text)


def _in_thread(work: Callable[[], T]) -> asyncio.Future[T]:
    """`work` in a thread of its own, which ends with it (closing its database connection); its
    result on the running loop. (Not the loop's executor: its threads would stay, idle.)"""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(error: BaseException | None, value: Any) -> None:
        if future.done():
            return  # its awaiter was canceled (the conversation ended)
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def body() -> None:
        try:
            value = work()
        except BaseException as error:  # noqa: BLE001 - handed to the awaiter, whatever it is
            loop.call_soon_threadsafe(settle, error, None)
        else:
            loop.call_soon_threadsafe(settle, None, value)
        finally:
            connection.close()

    threading.Thread(target=body, name="oz0-acp-call", daemon=True).start()
    return future


class OzClient:
    """What an ACP agent may ask of oz0: it streams its message, and asks permission for a tool call
    (decided by oz0's approval stage). oz0 offers no file system or terminal methods: the agent
    works in its own folder, and oz0's tools are on the `oz0` MCP server."""

    def __init__(self, conversation: Conversation) -> None:
        self.conversation = conversation
        self.session = conversation.session
        self.text: list[str] = []
        self.size = 0
        self.flooded = False  # it streamed more than OUTPUT_MAX: nothing more is kept
        self.canceled = False
        self.loading = False  # a loaded session's history, replayed: not the round's output

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        kind = getattr(update, "session_update", None)
        if kind == "agent_message_chunk" and not self.loading and not self.flooded:
            content = getattr(update, "content", None)
            if getattr(content, "type", None) == "text":
                text = str(getattr(content, "text", ""))
                self.size += len(text.encode("utf-8", "replace"))
                if self.size > OUTPUT_MAX:
                    self.flooded = True
                    self.text.clear()
                    if self.conversation.attention is not None:
                        self.conversation.attention.set()
                    return
                self.text.append(text)
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
            answer = await self.conversation.call(partial(self.session.approval, name, args))
        except HarnessCanceled:
            self.canceled = True
            await self.conversation.cancel_turn()
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


def run(session: HarnessSession) -> Any:
    argv, env = installed_program(session)
    jail = confined(session, argv, env, [*reads_of(argv), MCP_SERVER])
    return Conversation(session, jail).run()


async def _open_session(
    conn: Any, client: OzClient, conversation: Conversation, offered: Any, *, cwd: str, servers: list[Any]
) -> str:
    """The ACP session the prompt goes to. A session of the round started again (a retry, a lost
    worker) loads the one an earlier session opened (`session/load`) when the agent offers it
    (`agentCapabilities.loadSession`), so the agent has its conversation back; the history it
    replays is not the round's output. Else, or when the agent cannot load it (a session it stored
    in a job folder that is gone), a new session. The session's id is kept on the round as its
    checkpoint (`{acp_session}`) for the next one."""
    session = conversation.session
    earlier = ((session.journal.checkpoint or {}).get("state") or {}).get("acp_session")
    capabilities = getattr(offered, "agent_capabilities", None)
    if isinstance(earlier, str) and getattr(capabilities, "load_session", False):
        client.loading = True
        try:
            await conn.load_session(cwd=cwd, session_id=earlier, mcp_servers=servers)
        except acp.RequestError:
            pass  # the agent no longer has it: a new session
        else:
            await _in_thread(partial(_noted, session, earlier, loaded=True))
            return earlier
        finally:
            client.loading = False
    opened = await conn.new_session(cwd=cwd, mcp_servers=servers)
    await _in_thread(partial(_noted, session, str(opened.session_id), loaded=False))
    return str(opened.session_id)


def _noted(session: HarnessSession, session_id: str, *, loaded: bool) -> None:
    if loaded:
        session.resumed()  # `journal_resumed` in the trace: the session went on from the earlier one
    session.checkpoint({"acp_session": session_id})


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
