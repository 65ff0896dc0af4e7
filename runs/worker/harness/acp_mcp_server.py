"""The `oz0` MCP server an ACP agent is given (never imported by oz0): the agent starts it over stdio
as `python acp_mcp_server.py <socket>`, and each MCP tool call goes to the worker's harness session
over that unix socket as a JSON-lines protocol v1 `call` (docs/harness-jsonl.md).

Tools: `fail(kind, message)` (oz.fail: ends the job; only when the manifest lists oz.fail), `ask(question)` (oz.ask), and each tool the
manifest lists (registry tools and the delegating built-ins), by its wire name (`clock.now` as
`clock__now`), with the JSON Schema of its arguments as its input schema: the agent calls it with
the tool's own arguments, as it would call any MCP tool.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]

import anyio  # noqa: E402  (after the path is cleaned: this folder holds acp.py)
import mcp_types as types  # noqa: E402
from mcp.server.lowlevel import Server  # noqa: E402
from mcp.server.stdio import stdio_server  # noqa: E402


class Worker:
    """The socket to the worker: one call at a time, answered in order."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.stream = self.sock.makefile("rwb")
        self.lock = threading.Lock()
        self.counter = 0

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.stream.write(json.dumps(message).encode() + b"\n")
            self.stream.flush()
            line = self.stream.readline()
        if not line:
            raise RuntimeError("oz0 closed the connection")
        return dict(json.loads(line))

    def call(self, tool: str, args: dict[str, Any]) -> str:
        self.counter += 1
        result = self.request({"type": "call", "id": self.counter, "tool": tool, "args": args})
        if result.get("ok"):
            value = result.get("value")
            return value if isinstance(value, str) else json.dumps(value)
        return json.dumps(result.get("failure"))


FAIL_SCHEMA = {
    "type": "object",
    "properties": {"kind": {"type": "string"}, "message": {"type": "string", "maxLength": 2000}},
    "required": ["kind", "message"],
}
ASK_SCHEMA = {"type": "object", "properties": {"question": {"type": "string"}}, "required": ["question"]}


def tools_of(start: dict[str, Any]) -> dict[str, tuple[str, types.Tool]]:
    """Each MCP tool by its wire name: the oz0 tool it calls, and what the agent is told of it."""
    tools = {
        "fail": (
            "oz.fail",
            types.Tool(
                name="fail",
                description="End the job in failure with one of your declared failure kinds and a message in your own words.",
                input_schema=FAIL_SCHEMA,
            ),
        ),
        "ask": (
            "oz.ask",
            types.Tool(name="ask", description="Ask a person a question and wait for the answer.", input_schema=ASK_SCHEMA),
        ),
    }
    if "oz.fail" not in start.get("builtins", []):
        del tools["fail"]  # the agent does not list oz.fail (F6): its MCP server does not offer it
    for schema in start.get("tools", []):
        wire = schema["name"].replace(".", "__")
        parameters = schema.get("parameters") or {"type": "object"}
        tools[wire] = (
            schema["name"],
            types.Tool(name=wire, description=schema.get("description") or schema["name"], input_schema=parameters),
        )
    return tools


def main() -> None:
    worker = Worker(sys.argv[1])
    tools = tools_of(worker.request({"type": "hello"}))

    async def list_tools(context: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool for _, tool in tools.values()])

    async def call_tool(context: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name not in tools:
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=f"no tool named {params.name!r}")], is_error=True
            )
        answer = await anyio.to_thread.run_sync(worker.call, tools[params.name][0], dict(params.arguments or {}))
        return types.CallToolResult(content=[types.TextContent(type="text", text=answer)])

    server: Server[Any] = Server("oz0", on_list_tools=list_tools, on_call_tool=call_tool)

    async def serve() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    anyio.run(serve)


if __name__ == "__main__":
    main()
