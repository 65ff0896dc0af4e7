"""An agent speaking Zed's Agent Client Protocol, run by oz0's acp harness (oz0agents/examples/acp-triage.yaml).

oz0 is its ACP client: it opens a session whose MCP servers include one named `oz0`, whose tools are
oz0's (`fail`, `ask`, and the registry tools the manifest lists, `clock.now` as `clock__now`). This
agent reads the clock there and answers, or ends the job with `fail(not_found, ...)` for issue 404.
"""

import asyncio
import json

import acp
from acp.schema import InitializeResponse, NewSessionResponse, PromptResponse
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


class TriageAgent:
    def on_connect(self, conn):
        self.conn = conn

    async def initialize(self, protocol_version, **kwargs):
        return InitializeResponse(protocol_version=protocol_version)

    async def new_session(self, cwd, mcp_servers=None, **kwargs):
        self.oz0 = next(server for server in mcp_servers or [] if server.name == "oz0")
        return NewSessionResponse(session_id="triage")

    async def cancel(self, session_id, **kwargs):
        if getattr(self, "turn", None) is not None:
            self.turn.cancel()  # the turn ends `cancelled`

    async def prompt(self, session_id, prompt, **kwargs):
        self.turn = asyncio.ensure_future(self.triage(session_id, prompt[0].text))
        try:
            await self.turn
        except asyncio.CancelledError:
            return PromptResponse(stop_reason="cancelled")
        return PromptResponse(stop_reason="end_turn")

    async def triage(self, session_id, job):
        server = StdioServerParameters(command=self.oz0.command, args=self.oz0.args, env={e.name: e.value for e in self.oz0.env})
        async with stdio_client(server) as (read, write), ClientSession(read, write) as oz0:
            await oz0.initialize()
            issue = json.loads(job).get("issue") if job.startswith("{") else None
            if issue == 404:
                await oz0.call_tool("fail", {"kind": "not_found", "message": f"issue {issue} does not exist"})
                return
            now = getattr((await oz0.call_tool("clock__now", {})).content[0], "text", "")
            await self.conn.session_update(
                session_id, acp.update_agent_message_text(f"issue {issue} triaged; the clock said {now}")
            )


asyncio.run(acp.run_agent(TriageAgent()))  # type: ignore[arg-type]  # ACP's Agent is a protocol
