"""The `oz0` MCP server an ACP agent is given (never imported by oz0): the agent starts it over stdio
as `python acp_mcp_server.py <socket>`, and each MCP tool call goes to the worker's harness session
over that unix socket as a JSON-lines protocol v1 `call` (docs/harness-jsonl.md).

Tools: `fail(kind, message)` (oz.fail: ends the job; only when the manifest lists oz.fail), `ask(question)` (oz.ask), and each tool the
manifest lists (registry tools and the delegating built-ins), by its wire name (`clock.now` as
`clock__now`), with the JSON Schema of its arguments as its input schema: the agent calls it with
the tool's own arguments, as it would call any MCP tool.

It speaks MCP's stdio transport itself (newline-delimited JSON-RPC 2.0, the handshake revisions
2024-11-05 to 2025-11-25) with the standard library alone: the MCP SDK's import took 0.8 s of CPU
and some 40 MB at every ACP session's start, for a server that only lists and calls tools. A
client that first probes `server/discover` (the 2026 revision) is answered "method not found" and
falls back to `initialize`, as the revision asks of clients meeting a server of the handshake era.
Each `tools/call` runs in a thread of its own, so a `ping` is answered while a call waits hours on a
person; the worker's socket still takes one call at a time, in order.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from typing import Any, BinaryIO

# Nothing of this folder (oz0's harness modules) may stand in for a module of the standard library.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]

# Oldest to newest; a client asking for another is answered with the newest (MCP's negotiation).
PROTOCOL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602
# A message's longest line: the worker takes a call's line of at most 1 MiB (channel.LINE_MAX), and
# an MCP message around the same arguments is a little longer. A longer one is refused unread.
MESSAGE_MAX = 2 * 1024 * 1024


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


def tools_of(start: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each MCP tool by its wire name: the oz0 tool it calls, and what the agent is told of it."""
    tools: dict[str, tuple[str, dict[str, Any]]] = {
        "fail": (
            "oz.fail",
            {
                "name": "fail",
                "description": "End the job in failure with one of your declared failure kinds and a message in your own words.",
                "inputSchema": FAIL_SCHEMA,
            },
        ),
        "ask": (
            "oz.ask",
            {"name": "ask", "description": "Ask a person a question and wait for the answer.", "inputSchema": ASK_SCHEMA},
        ),
    }
    if "oz.fail" not in start.get("builtins", []):
        del tools["fail"]  # the agent does not list oz.fail (F6): its MCP server does not offer it
    for schema in start.get("tools", []):
        wire = schema["name"].replace(".", "__")
        parameters = schema.get("parameters") or {"type": "object"}
        tools[wire] = (
            schema["name"],
            {"name": wire, "description": schema.get("description") or schema["name"], "inputSchema": parameters},
        )
    return tools


def text_result(text: str, *, error: bool = False) -> dict[str, Any]:
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
    if error:
        result["isError"] = True
    return result


class McpServer:
    """One client's MCP session over a pair of byte streams: `serve` reads JSON-RPC lines until the
    input ends; requests are answered in the order their work ends, each `tools/call` from a thread
    of its own."""

    def __init__(self, worker: Worker, tools: dict[str, tuple[str, dict[str, Any]]], output: BinaryIO) -> None:
        self.worker = worker
        self.tools = tools
        self.output = output
        self.writing = threading.Lock()
        # Calls still running, and those of them the client gave up (notifications/cancelled):
        # a given-up call still ends at oz0, but the client is sent no answer, as the protocol asks.
        # A cancel of a call already answered (or never made) is dropped: nothing waits on it.
        self.in_flight: set[Any] = set()
        self.canceled: set[Any] = set()
        self.calls = threading.Lock()

    def serve(self, lines: BinaryIO) -> None:
        while line := lines.readline(MESSAGE_MAX + 1):
            if len(line) > MESSAGE_MAX and not line.endswith(b"\n"):
                while (rest := lines.readline(MESSAGE_MAX)) and not rest.endswith(b"\n"):
                    pass  # the rest of the line, dropped unread
                self.send(error_of(None, INVALID_REQUEST, f"Invalid Request: a message longer than {MESSAGE_MAX} bytes"))
                continue
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError:
                self.send(error_of(None, PARSE_ERROR, "Parse error"))
                continue
            if isinstance(message, list):  # a batch (2025-03-26): answered as one array
                answers = [answer for part in message if (answer := self.handle(part, batched=True)) is not None]
                if answers or not message:
                    self.send(answers or error_of(None, INVALID_REQUEST, "Invalid Request: an empty batch"))
                continue
            answer = self.handle(message, batched=False)
            if answer is not None:
                self.send(answer)

    def handle(self, message: Any, *, batched: bool) -> dict[str, Any] | None:
        """The answer to one message, or None: a notification, a response, or a call answered later
        from its thread."""
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return error_of(
                message.get("id") if isinstance(message, dict) else None,
                INVALID_REQUEST,
                "Invalid Request: not a JSON-RPC 2.0 message",
            )
        method, ident = message.get("method"), message.get("id")
        if not isinstance(method, str):
            return None  # a response: this server sends no requests, so none is awaited
        params = message.get("params")
        if "id" not in message:
            if method == "notifications/cancelled" and isinstance(params, dict):
                with self.calls:
                    if params.get("requestId") in self.in_flight:
                        self.canceled.add(params.get("requestId"))
            return None
        if params is not None and not isinstance(params, dict):
            return error_of(ident, INVALID_PARAMS, "params must be an object")
        params = params or {}
        if method == "initialize":
            asked = params.get("protocolVersion")
            version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[-1]
            return result_of(
                ident,
                {
                    "protocolVersion": version,
                    "capabilities": {"tools": {"listChanged": False}},
                    "serverInfo": {"name": "oz0", "version": "1"},
                },
            )
        if method == "ping":
            return result_of(ident, {})
        if method == "tools/list":
            return result_of(ident, {"tools": [tool for _, tool in self.tools.values()]})
        if method == "tools/call":
            name, arguments = params.get("name"), params.get("arguments") or {}
            if not isinstance(name, str) or not isinstance(arguments, dict):
                return error_of(ident, INVALID_PARAMS, "tools/call takes a tool's name and an object of arguments")
            if name not in self.tools:
                return result_of(ident, text_result(f"no tool named {name!r}", error=True))
            if batched:  # a batch's answers go back together: its calls are made in turn
                return result_of(ident, self.call(name, arguments))
            with self.calls:
                self.in_flight.add(ident)
            threading.Thread(target=self.answer_call, args=(ident, name, arguments), daemon=True).start()
            return None
        return error_of(ident, METHOD_NOT_FOUND, f"Method not found: {method}")

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        try:
            return text_result(self.worker.call(self.tools[name][0], arguments))
        except (OSError, RuntimeError, ValueError) as failed:
            return text_result(f"oz0 could not take the call: {failed}", error=True)

    def answer_call(self, ident: Any, name: str, arguments: dict[str, Any]) -> None:
        answer = result_of(ident, self.call(name, arguments))
        with self.calls:
            self.in_flight.discard(ident)
            if ident in self.canceled:
                self.canceled.discard(ident)
                return
        self.send(answer)

    def send(self, message: Any) -> None:
        data = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        with self.writing:
            self.output.write(data)
            self.output.flush()


def result_of(ident: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "result": result}


def error_of(ident: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "error": {"code": code, "message": message}}


def main() -> None:
    worker = Worker(sys.argv[1])
    tools = tools_of(worker.request({"type": "hello"}))
    McpServer(worker, tools, sys.stdout.buffer).serve(sys.stdin.buffer)


if __name__ == "__main__":
    main()
