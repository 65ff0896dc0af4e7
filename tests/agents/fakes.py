"""Local fake model servers that speak the real wire formats (no SDK mocks).

`FakeServer("openai")` answers `POST /v1/chat/completions` as the Chat Completions API does;
`FakeServer("anthropic")` answers `POST /v1/messages` as the Messages API does, streamed
as server-sent events when the request asks for `stream: true`. Each test scripts the
replies for a model name of its own, so parallel runs never share a script; every request
is recorded for assertions.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    # Anthropic streaming: (event name, data) pairs, written as server-sent events.
    events: list[tuple[str, dict[str, Any]]] | None = None
    # An Anthropic message (non-streamed shape) turned into events when the client streams.
    message: dict[str, Any] | None = None


class FakeServer:
    def __init__(self, api: str, *, api_key: str) -> None:
        assert api in ("openai", "anthropic")
        self.api = api
        self.api_key = api_key
        self.lock = threading.Lock()
        self.scripts: dict[str, list[Reply]] = {}
        self.requests: dict[str, list[dict[str, Any]]] = {}
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name=f"fake-{api}", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def script(self, model: str, replies: Iterable[Reply]) -> None:
        with self.lock:
            self.scripts[model] = list(replies)
            self.requests[model] = []

    def requests_for(self, model: str) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.requests.get(model, []))

    def _next(self, model: str, request: dict[str, Any]) -> Reply:
        with self.lock:
            self.requests.setdefault(model, []).append(request)
            replies = self.scripts.get(model)
            if not replies:
                return Reply(
                    400, body=_error(self.api, "invalid_request_error", f"the fake server has no reply left for {model!r}")
                )
            return replies.pop(0)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                path = "/v1/chat/completions" if server.api == "openai" else "/v1/messages"
                if self.path != path:
                    self._json(404, _error(server.api, "not_found_error", f"no route {self.path}"))
                    return
                key = (
                    (self.headers.get("Authorization") or "").removeprefix("Bearer ")
                    if server.api == "openai"
                    else self.headers.get("x-api-key")
                )
                if key != server.api_key:
                    self._json(
                        401,
                        _error(
                            server.api,
                            "authentication_error",
                            "invalid x-api-key" if server.api == "anthropic" else "Incorrect API key provided",
                        ),
                    )
                    return
                if server.api == "anthropic" and not self.headers.get("anthropic-version"):
                    self._json(400, _error("anthropic", "invalid_request_error", "anthropic-version header is required"))
                    return
                try:
                    body = json.loads(raw)
                except ValueError:
                    self._json(400, _error(server.api, "invalid_request_error", "the body is not JSON"))
                    return
                request = {"headers": {k.lower(): v for k, v in self.headers.items()}, "body": body, "at": time.monotonic()}
                reply = server._next(str(body.get("model")), request)
                if reply.status != 200 or (reply.events is None and reply.message is None):
                    self._json(reply.status, reply.body, reply.headers)
                    return
                events = reply.events if reply.events is not None else message_events(reply.message or {})
                if not body.get("stream"):
                    self._json(200, reply.message or {}, reply.headers)
                    return
                self._stream(events, reply.headers)

            def _json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, events: list[tuple[str, dict[str, Any]]], headers: dict[str, str]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                for name, data in events:
                    self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
                    self.wfile.flush()
                self.close_connection = True

        return Handler


def _error(api: str, kind: str, message: str, code: str | None = None) -> dict[str, Any]:
    if api == "anthropic":
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


# ---- OpenAI Chat Completions replies ----


def openai_completion(message: dict[str, Any], finish: str, *, prompt: int = 11, completion: int = 7) -> Reply:
    return Reply(
        body={
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": "fake",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": None, "refusal": None, **message},
                    "logprobs": None,
                    "finish_reason": finish,
                }
            ],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        }
    )


def openai_text(text: str, **usage: int) -> Reply:
    return openai_completion({"content": text}, "stop", **usage)


def openai_calls(calls: list[tuple[str, Any]], **usage: int) -> Reply:
    """`calls`: (wire name, arguments); arguments given as a str are sent verbatim (malformed JSON tests)."""
    tool_calls = [
        {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)},
        }
        for i, (name, args) in enumerate(calls)
    ]
    return openai_completion({"tool_calls": tool_calls}, "tool_calls", **usage)


def openai_error(
    status: int, *, code: str | None = None, message: str = "error", retry_after: str | None = None, kind: str = "server_error"
) -> Reply:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return Reply(status, headers=headers, body=_error("openai", kind, message, code))


# ---- Anthropic Messages replies ----


def anthropic_message(
    content: list[dict[str, Any]], stop: str | None, *, input_tokens: int = 13, output_tokens: int = 5, stop_details: Any = None
) -> Reply:
    message = {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": "fake",
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }
    if stop_details is not None:
        message["stop_details"] = stop_details
    return Reply(message=message)


def anthropic_text(text: str, **usage: int) -> Reply:
    return anthropic_message([{"type": "text", "text": text}], "end_turn", **usage)


def anthropic_tool_use(calls: list[tuple[str, dict[str, Any]]], **usage: int) -> Reply:
    content = [{"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": args} for i, (name, args) in enumerate(calls)]
    return anthropic_message(content, "tool_use", **usage)


def anthropic_error(status: int, kind: str, message: str = "error", *, retry_after: str | None = None) -> Reply:
    headers = {"retry-after": retry_after} if retry_after is not None else {}
    return Reply(status, headers=headers, body=_error("anthropic", kind, message))


def anthropic_stream_error(kind: str = "overloaded_error") -> Reply:
    """A 200 whose stream breaks off with an `error` event, as the API does under load."""
    return Reply(
        events=[
            (
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": "msg_fake",
                        "type": "message",
                        "role": "assistant",
                        "content": [],
                        "model": "fake",
                        "stop_reason": None,
                        "usage": {"input_tokens": 9, "output_tokens": 1},
                    },
                },
            ),
            ("ping", {"type": "ping"}),
            ("error", {"type": "error", "error": {"type": kind, "message": "Overloaded"}}),
        ]
    )


def message_events(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A Messages answer as the stream of events the API sends for it."""
    usage = message.get("usage", {})
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": usage.get("input_tokens", 0), "output_tokens": 1},
    }
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start}),
        ("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(message.get("content", [])):
        if block["type"] == "text":
            events.append(
                (
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
                )
            )
            text = block["text"]
            for part in (text[: len(text) // 2], text[len(text) // 2 :]):
                events.append(
                    (
                        "content_block_delta",
                        {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": part}},
                    )
                )
        else:
            events.append(
                (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}},
                    },
                )
            )
            raw = block["input"] if isinstance(block["input"], str) else json.dumps(block["input"])
            for part in (raw[: len(raw) // 2], raw[len(raw) // 2 :]):
                events.append(
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {"type": "input_json_delta", "partial_json": part},
                        },
                    )
                )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    delta: dict[str, Any] = {"stop_reason": message.get("stop_reason"), "stop_sequence": None}
    if "stop_details" in message:
        delta["stop_details"] = message["stop_details"]
    events.append(
        ("message_delta", {"type": "message_delta", "delta": delta, "usage": {"output_tokens": usage.get("output_tokens", 0)}})
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events
