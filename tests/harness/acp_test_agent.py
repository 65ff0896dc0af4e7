"""An ACP agent the tests script through the environment (OZ0_TEST_SCRIPT: a JSON list of steps,
a step with `once: PATH` taken only while PATH does not exist, which it then creates;
OZ0_TEST_RECORD: a file where it notes what happened, with times; OZ0_TEST_ACP_SESSIONS: a folder,
relative to its working folder or not, where it keeps its sessions and offers `session/load`). It
finds oz0's tools on the MCP server named `oz0` that its session was opened with, as any ACP agent
would, through the little of an MCP client it needs (MCP's own client meets that server in
tests/harness/test_mcp_server.py; here it only has to be reached, and its import would cost each of
the suite's ACP agents some 0.6 s of CPU at start)."""

import asyncio
import json
import os
import sys
import time
import uuid

import acp
from acp.schema import (
    AgentCapabilities,
    InitializeResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PermissionOption,
    PromptResponse,
    ToolCallUpdate,
)

RECORD = os.environ.get("OZ0_TEST_RECORD")
SESSIONS = os.environ.get("OZ0_TEST_ACP_SESSIONS")


def note(**what):
    if RECORD:
        with open(RECORD, "a") as record:
            record.write(json.dumps({**what, "at": time.time()}) + "\n")


class McpClient:
    """An MCP client over a stdio server's pipes: requests answered by id, a cancelled request
    announced with notifications/cancelled, as MCP's own client does."""

    def __init__(self, process):
        self.process = process
        self.pending = {}
        self.last_id = 0
        self.reading = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, server):
        process = await asyncio.create_subprocess_exec(
            server.command,
            *server.args,
            env={e.name: e.value for e in server.env},
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=1 << 24,
        )
        client = cls(process)
        await client.request(
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "acp-test-agent", "version": "1"}},
        )
        client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return client

    async def _read(self):
        async for line in self.process.stdout:
            message = json.loads(line)
            waiting = self.pending.pop(message.get("id"), None)
            if waiting is not None and not waiting.done():
                waiting.set_result(message)
        for waiting in self.pending.values():
            if not waiting.done():
                waiting.set_exception(ConnectionError("the MCP server went away"))

    def send(self, message):
        if self.process.stdin.is_closing():
            return  # (a call cancelled as the session ends)
        self.process.stdin.write(json.dumps(message).encode() + b"\n")

    async def request(self, method, params):
        self.last_id += 1
        ident = self.last_id
        answered = self.pending[ident] = asyncio.get_running_loop().create_future()
        self.send({"jsonrpc": "2.0", "id": ident, "method": method, "params": params})
        try:
            message = await answered
        except asyncio.CancelledError:
            self.pending.pop(ident, None)
            self.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": ident}})
            raise
        if "error" in message:
            raise RuntimeError(message["error"]["message"])
        return message["result"]

    async def close(self):
        self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), 2)
        except TimeoutError:
            self.process.kill()
        self.reading.cancel()


class ScriptedAgent:
    def __init__(self):
        self.conn = None
        self.servers = {}
        self.canceled = asyncio.Event()

    def on_connect(self, conn):
        self.conn = conn

    async def initialize(self, protocol_version, client_capabilities=None, client_info=None, **kwargs):
        if SESSIONS:  # it keeps its sessions (in that folder) and offers `session/load`
            return InitializeResponse(protocol_version=protocol_version, agent_capabilities=AgentCapabilities(load_session=True))
        return InitializeResponse(protocol_version=protocol_version)

    async def new_session(self, cwd, additional_directories=None, mcp_servers=None, **kwargs):
        self.servers = {server.name: server for server in mcp_servers or []}
        session_id = f"s-{uuid.uuid4().hex[:8]}" if SESSIONS else "s1"
        if SESSIONS:
            os.makedirs(SESSIONS, exist_ok=True)
            with open(os.path.join(SESSIONS, session_id), "w") as stored:
                stored.write("an earlier turn")
        note(event="session", servers=sorted(self.servers), id=session_id)
        return NewSessionResponse(session_id=session_id)

    async def load_session(self, cwd, session_id, mcp_servers=None, additional_directories=None, **kwargs):
        if not SESSIONS or not os.path.exists(os.path.join(SESSIONS, session_id)):
            raise acp.RequestError.invalid_params({"session_id": session_id})
        self.servers = {server.name: server for server in mcp_servers or []}
        # Its history is replayed to the client, as ACP asks: not the turn's output.
        await self.conn.session_update(session_id, acp.update_agent_message_text("(replayed history) "))
        note(event="load", id=session_id)
        return LoadSessionResponse()

    async def cancel(self, session_id, **kwargs):
        note(event="cancel")
        self.canceled.set()

    async def prompt(self, session_id, prompt, **kwargs):
        mcp = await McpClient.start(self.servers["oz0"])
        try:
            return await self.play(session_id, mcp)
        finally:
            await mcp.close()

    async def play(self, session_id, mcp):
        last = None
        listed = (await mcp.request("tools/list", {}))["tools"]
        note(event="tools", names=sorted(t["name"] for t in listed), schemas={t["name"]: t["inputSchema"] for t in listed})
        for step in json.loads(os.environ.get("OZ0_TEST_SCRIPT", "[]")):
            if "once" in step:  # a step taken in the round's first session only (a retry runs the script again)
                if os.path.exists(step["once"]):
                    continue
                open(step["once"], "w").close()
            if "tool" in step:
                call = asyncio.ensure_future(mcp.request("tools/call", {"name": step["tool"], "arguments": step.get("args", {})}))
                waiter = asyncio.ensure_future(self.canceled.wait())
                await asyncio.wait([call, waiter], return_when=asyncio.FIRST_COMPLETED)
                if self.canceled.is_set():
                    call.cancel()
                    return PromptResponse(stop_reason="cancelled")
                last = call.result()["content"][0]["text"]
            elif "permission" in step:
                # Ask the client before a tool call of the agent's own; say what it answered.
                asked = asyncio.ensure_future(
                    self.conn.request_permission(
                        session_id=session_id,
                        tool_call=ToolCallUpdate(tool_call_id="t1", **step["permission"]),
                        options=[
                            PermissionOption(option_id="always", name="Always allow", kind="allow_always"),
                            PermissionOption(option_id="once", name="Allow", kind="allow_once"),
                            PermissionOption(option_id="no", name="Reject", kind="reject_once"),
                        ],
                    )
                )
                if "flood" in step:  # message text while it waits for the answer, far past an output's cap
                    await asyncio.sleep(step.get("flood_after", 0))
                    for _ in range(step["flood"] // 65536):
                        await self.conn.session_update(session_id, acp.update_agent_message_text("x" * 65536))
                waiter = asyncio.ensure_future(self.canceled.wait())
                await asyncio.wait([asked, waiter], return_when=asyncio.FIRST_COMPLETED)
                if self.canceled.is_set():
                    return PromptResponse(stop_reason="cancelled")
                last = json.dumps(asked.result().model_dump(mode="json", by_alias=True, exclude_none=True))
                note(event="answered", outcome=asked.result().outcome.outcome)
            elif "say" in step:
                text = last if step["say"] == "$last" else step["say"]
                await self.conn.session_update(session_id, acp.update_agent_message_text(text))
            elif "wait" in step:
                await self.canceled.wait()
                return PromptResponse(stop_reason="cancelled")
            elif "crash" in step:
                print("the agent crashed on purpose", file=sys.stderr, flush=True)
                os._exit(step["crash"])
        return PromptResponse(stop_reason="end_turn")


asyncio.run(acp.run_agent(ScriptedAgent()))
