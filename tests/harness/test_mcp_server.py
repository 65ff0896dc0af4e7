"""The `oz0` MCP server an ACP agent starts (runs/worker/harness/acp_mcp_server.py), driven over its
stdio by MCP's own client (its discover probe, then the handshake) and by hand (what a careless or
hostile client may send), with a fake worker on the unix socket in place of a harness session."""

from __future__ import annotations

import ast
import asyncio
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from runs.worker.harness.acp import MCP_SERVER

TOOLS = [
    {"name": "clock.now", "description": "The time.", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}
]


class FakeWorker:
    """The worker's end of the server's socket: answers `hello` with the manifest's tools and each
    `call` with what its tool was asked, or holds calls while `held` is clear."""

    def __init__(self, *, builtins: tuple[str, ...] = ("oz.fail", "oz.ask"), close_on_call: bool = False) -> None:
        self.folder = tempfile.mkdtemp(prefix="oz0-mcp-test-")
        self.path = os.path.join(self.folder, "calls.sock")
        self.builtins = list(builtins)
        self.close_on_call = close_on_call
        self.calls: list[dict[str, Any]] = []
        self.released = threading.Event()
        self.released.set()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(1)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        connection, _ = self.listener.accept()
        stream = connection.makefile("rwb")
        for line in stream:
            message = json.loads(line)
            if message["type"] == "hello":
                answer: dict[str, Any] = {"builtins": self.builtins, "tools": TOOLS}
            else:
                self.calls.append(message)
                if self.close_on_call:
                    connection.close()
                    return
                self.released.wait(30)
                answer = {"ok": True, "value": f"{message['tool']} {json.dumps(message['args'], sort_keys=True)}"}
            stream.write(json.dumps(answer).encode() + b"\n")
            stream.flush()

    def close(self) -> None:
        self.listener.close()
        os.unlink(self.path)
        os.rmdir(self.folder)


@pytest.fixture
def worker() -> Iterator[FakeWorker]:
    fake = FakeWorker()
    yield fake
    fake.close()


class Raw:
    """The server's process, spoken to line by line."""

    def __init__(self, worker: FakeWorker) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(MCP_SERVER), worker.path], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )

    def send(self, message: Any) -> None:
        assert self.process.stdin is not None
        text = message if isinstance(message, str) else json.dumps(message)
        self.process.stdin.write(text.encode() + b"\n")
        self.process.stdin.flush()

    def read(self) -> Any:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, "the server closed its output"
        return json.loads(line)

    def ask(self, ident: int, method: str, params: Any = None) -> Any:
        self.send({"jsonrpc": "2.0", "id": ident, "method": method, **({} if params is None else {"params": params})})
        return self.read()

    def close(self) -> int:
        assert self.process.stdin is not None
        self.process.stdin.close()
        return self.process.wait(10)


@pytest.fixture
def raw(worker: FakeWorker) -> Iterator[Raw]:
    server = Raw(worker)
    yield server
    if server.process.poll() is None:
        server.close()


def parameters(worker: FakeWorker) -> Any:
    from mcp import StdioServerParameters

    return StdioServerParameters(command=sys.executable, args=[str(MCP_SERVER), worker.path])


@pytest.mark.spec("F7")
def test_mcps_own_client_finds_fail_on_it_after_its_discover_probe_and_the_call_reaches_oz0_as_oz_fail(
    worker: FakeWorker,
) -> None:
    from mcp.client.client import Client

    async def talk() -> tuple[Any, Any, Any, Any]:
        async with Client(parameters(worker)) as client:  # mode "auto": server/discover first
            listed = (await client.list_tools()).tools
            failed = await client.call_tool("fail", {"kind": "not_found", "message": "no such issue"})
            timed = await client.call_tool("clock__now", {"tz": "UTC"})
            unknown = await client.call_tool("rm_rf", {})
            return listed, failed, timed, unknown

    listed, failed, timed, unknown = asyncio.run(talk())
    schemas = {tool.name: tool.input_schema for tool in listed}
    assert set(schemas) == {"fail", "ask", "clock__now"}
    assert schemas["fail"]["required"] == ["kind", "message"] and schemas["clock__now"] == TOOLS[0]["parameters"]
    assert [(call["tool"], call["args"]) for call in worker.calls] == [
        ("oz.fail", {"kind": "not_found", "message": "no such issue"}),
        ("clock.now", {"tz": "UTC"}),
    ]
    assert failed.content[0].text == 'oz.fail {"kind": "not_found", "message": "no such issue"}' and not failed.is_error
    assert timed.content[0].text == 'clock.now {"tz": "UTC"}'
    assert unknown.is_error and "no tool named 'rm_rf'" in unknown.content[0].text


def test_mcps_own_client_session_shakes_hands_at_the_newest_revision_it_shares(worker: FakeWorker) -> None:
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

    async def talk() -> tuple[str, list[str]]:
        async with stdio_client(parameters(worker)) as (read, write), ClientSession(read, write) as session:
            started = await session.initialize()
            await session.send_ping()
            return str(started.protocol_version), sorted(tool.name for tool in (await session.list_tools()).tools)

    version, names = asyncio.run(talk())
    assert version == "2025-11-25" and names == ["ask", "clock__now", "fail"]


def test_it_answers_each_revision_it_speaks_with_that_one_and_any_other_with_its_newest(raw: Raw) -> None:
    for ident, asked in enumerate(("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"), start=1):
        answer = raw.ask(ident, "initialize", {"protocolVersion": asked, "capabilities": {}, "clientInfo": {"name": "t"}})
        assert answer["id"] == ident and answer["result"]["protocolVersion"] == asked
    newer = raw.ask(9, "initialize", {"protocolVersion": "2099-01-01", "capabilities": {}})
    assert newer["result"]["protocolVersion"] == "2025-11-25"
    assert newer["result"]["capabilities"] == {"tools": {"listChanged": False}}
    assert newer["result"]["serverInfo"]["name"] == "oz0"


def test_bad_messages_get_typed_errors_and_the_server_goes_on(raw: Raw, worker: FakeWorker) -> None:
    raw.send("{not json")
    assert raw.read() == {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}}
    raw.send({"id": 2, "method": "ping"})  # no "jsonrpc": "2.0"
    assert raw.read()["error"]["code"] == -32600
    raw.send("[]")
    assert raw.read()["error"]["code"] == -32600
    assert raw.ask(3, "server/discover")["error"]["code"] == -32601
    assert raw.ask(4, "resources/list")["error"]["code"] == -32601
    assert raw.ask(5, "tools/call", {"name": "ask", "arguments": "a string"})["error"]["code"] == -32602
    assert raw.ask(6, "tools/call", {"arguments": {}})["error"]["code"] == -32602
    assert raw.ask(7, "tools/list", ["not", "an", "object"])["error"]["code"] == -32602
    raw.send({"jsonrpc": "2.0", "id": 99, "result": {}})  # a response to nothing: no answer
    raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert raw.ask(8, "ping") == {"jsonrpc": "2.0", "id": 8, "result": {}}
    assert worker.calls == []
    assert raw.close() == 0


def test_a_ping_is_answered_while_a_call_waits_and_a_canceled_call_is_never_answered(raw: Raw, worker: FakeWorker) -> None:
    worker.released.clear()
    raw.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "ask", "arguments": {"question": "ok?"}}})
    assert raw.ask(2, "ping")["id"] == 2  # the call still waits on the worker
    worker.released.set()
    assert raw.read() == {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {"content": [{"type": "text", "text": 'oz.ask {"question": "ok?"}'}]},
    }
    worker.released.clear()
    raw.send({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "clock__now"}})
    raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3, "reason": "gave up"}})
    # The server reads its input in order: once the ping is answered, it has taken the cancel.
    assert raw.ask(4, "ping")["id"] == 4
    worker.released.set()
    # The worker takes one call at a time: call 5 is answered after call 3 came back from oz0.
    raw.send({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "clock__now"}})
    answers = [raw.read(), raw.ask(6, "ping")]
    raw.close()
    assert raw.process.stdout is not None
    answers += [json.loads(line) for line in raw.process.stdout.read().splitlines()]
    assert [answer["id"] for answer in answers] == [5, 6]  # the canceled call's answer never came
    assert [call["tool"] for call in worker.calls] == ["oz.ask", "clock.now", "clock.now"]


def test_a_message_past_its_cap_is_refused_unread_and_the_server_goes_on(raw: Raw, worker: FakeWorker) -> None:
    from runs.worker.harness.acp_mcp_server import MESSAGE_MAX

    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "clock__now", "arguments": {"tz": ""}}}
    padded = json.dumps(call).replace('"tz": ""', f'"tz": "{"x" * MESSAGE_MAX}"')
    raw.send(padded)
    refused = raw.read()
    assert refused["id"] is None and refused["error"]["code"] == -32600 and str(MESSAGE_MAX) in refused["error"]["message"]
    assert raw.ask(2, "ping") == {"jsonrpc": "2.0", "id": 2, "result": {}}
    assert worker.calls == []  # the oversized call never reached oz0
    near = {**call, "id": 3, "params": {"name": "clock__now", "arguments": {"tz": "y" * (MESSAGE_MAX // 2)}}}
    raw.send(near)
    assert raw.read()["id"] == 3 and len(worker.calls) == 1  # a long message within the cap is served


class InstantWorker:
    def call(self, tool: str, args: dict[str, Any]) -> str:
        return tool


class WatchedOutput(io.BytesIO):
    """The server's output, with an event set at each write."""

    def __init__(self) -> None:
        super().__init__()
        self.written = threading.Event()

    def write(self, data: Any) -> int:
        count = super().write(data)
        self.written.set()
        return count


def test_a_cancel_of_a_call_not_running_is_dropped_not_kept() -> None:
    """A cancel for an id never called, or for a call already answered (the notification crossed
    the answer), leaves nothing behind: a long session would otherwise keep every such id."""
    from runs.worker.harness.acp_mcp_server import McpServer

    output = WatchedOutput()
    server = McpServer(InstantWorker(), {"clock__now": ("clock.now", {})}, output)  # type: ignore[arg-type]

    def cancel(ident: Any) -> None:
        message = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": ident}}
        assert server.handle(message, batched=False) is None

    cancel(41)
    call = {"jsonrpc": "2.0", "id": 42, "method": "tools/call", "params": {"name": "clock__now", "arguments": {}}}
    assert server.handle(call, batched=False) is None
    assert output.written.wait(10)
    assert b'"id":42' in output.getvalue()
    cancel(42)
    assert server.canceled == set() and server.in_flight == set()


def test_a_batch_is_answered_as_one_array_of_its_requests(raw: Raw, worker: FakeWorker) -> None:
    raw.send(
        [
            {"jsonrpc": "2.0", "id": 1, "method": "ping"},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "clock__now", "arguments": {}}},
            7,
        ]
    )
    ping, call, wrong = raw.read()
    assert ping == {"jsonrpc": "2.0", "id": 1, "result": {}}
    assert call["id"] == 2 and call["result"]["content"][0]["text"] == "clock.now {}"
    assert wrong["error"]["code"] == -32600


def test_an_agent_that_does_not_list_oz_fail_is_not_offered_it() -> None:
    unlisted = FakeWorker(builtins=("oz.ask",))
    server = Raw(unlisted)
    try:
        names = [tool["name"] for tool in server.ask(1, "tools/list")["result"]["tools"]]
        assert names == ["ask", "clock__now"]
        called = server.ask(2, "tools/call", {"name": "fail", "arguments": {"kind": "x", "message": "y"}})
        assert called["result"]["isError"] is True and unlisted.calls == []
    finally:
        server.close()
        unlisted.close()


def test_a_worker_gone_mid_call_is_a_tool_error_not_a_hang() -> None:
    gone = FakeWorker(close_on_call=True)
    server = Raw(gone)
    try:
        answer = server.ask(1, "tools/call", {"name": "ask", "arguments": {"question": "?"}})
        assert answer["result"]["isError"] is True
        assert "oz0 could not take the call" in answer["result"]["content"][0]["text"]
    finally:
        server.close()
        gone.close()


def test_it_imports_nothing_but_the_standard_library() -> None:
    """Every ACP session starts one: an SDK's import (0.8 s of CPU, some 40 MB) at each start."""
    tree = ast.parse(MCP_SERVER.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert imported - {"__future__"} <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)
