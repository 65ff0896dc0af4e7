"""An ACP agent the tests script through the environment (OZ0_TEST_SCRIPT: a JSON list of steps,
a step with `once: PATH` taken only while PATH does not exist, which it then creates;
OZ0_TEST_RECORD: a file where it notes what happened, with times; OZ0_TEST_ACP_SESSIONS: a folder,
relative to its working folder or not, where it keeps its sessions and offers `session/load`). It
finds oz0's tools on the MCP server named `oz0` that its session was opened with, as any ACP agent
would."""

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
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

RECORD = os.environ.get("OZ0_TEST_RECORD")
SESSIONS = os.environ.get("OZ0_TEST_ACP_SESSIONS")


def note(**what):
    if RECORD:
        with open(RECORD, "a") as record:
            record.write(json.dumps({**what, "at": time.time()}) + "\n")


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
        oz0 = self.servers["oz0"]
        params = StdioServerParameters(command=oz0.command, args=oz0.args, env={e.name: e.value for e in oz0.env})
        last = None
        async with stdio_client(params) as (read, write), ClientSession(read, write) as mcp:
            await mcp.initialize()
            listed = (await mcp.list_tools()).tools
            note(event="tools", names=sorted(t.name for t in listed), schemas={t.name: t.input_schema for t in listed})
            for step in json.loads(os.environ.get("OZ0_TEST_SCRIPT", "[]")):
                if "once" in step:  # a step taken in the round's first session only (a retry runs the script again)
                    if os.path.exists(step["once"]):
                        continue
                    open(step["once"], "w").close()
                if "tool" in step:
                    call = asyncio.ensure_future(mcp.call_tool(step["tool"], step.get("args", {})))
                    waiter = asyncio.ensure_future(self.canceled.wait())
                    await asyncio.wait([call, waiter], return_when=asyncio.FIRST_COMPLETED)
                    if self.canceled.is_set():
                        call.cancel()
                        return PromptResponse(stop_reason="cancelled")
                    last = call.result().content[0].text
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
