"""The Anthropic Messages provider, streamed (server-sent events): one attempt per call.

Streaming is what surfaces an `overloaded_error` after a 200: the stream's `error` event
becomes AttemptFailed("stream_error", word=<the error's type>), which the round counts as
overload (S26).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import httpx

from runs.worker.providers.base import AttemptFailed, ProviderAnswer, ProviderRequest
from runs.worker.providers.http import (
    HttpProvider,
    ask_question,
    call_id,
    decode_tool,
    encode_tool,
    error_body,
    http_failure,
    parse_arguments,
    with_builtins,
)

API_VERSION = "2023-06-01"
NORMAL_STOP = ("end_turn", "tool_use", "stop_sequence")
CONTEXT_MARKERS = ("prompt is too long", "context window", "context length")


class AnthropicProvider(HttpProvider):
    def complete(self, request: ProviderRequest) -> ProviderAnswer:
        headers = {"Content-Type": "application/json", "anthropic-version": API_VERSION, "Accept": "text/event-stream"}
        if self.api_key:
            headers["x-api-key"] = self.api_key
        try:
            with (
                self.client() as client,
                client.stream("POST", f"{self.base_url}/messages", json=self.body(request), headers=headers) as response,
            ):
                if response.status_code != 200:
                    response.read()
                    raise _status_failure(response)
                return read_stream(_events(response.iter_lines()))
        except httpx.HTTPError as error:
            raise AttemptFailed("transport", f"{type(error).__name__}: {error}") from None

    def body(self, request: ProviderRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": request.model,
            "max_tokens": self.max_tokens,
            "messages": wire_messages(request.messages),
            "stream": True,
            "tools": [
                {
                    "name": encode_tool(t["name"]),
                    "description": t.get("description", ""),
                    "input_schema": t.get("parameters") or {"type": "object"},
                }
                for t in with_builtins(list(request.tools))
            ],
        }
        if request.system:
            body["system"] = request.system
        return body


def _status_failure(response: httpx.Response) -> AttemptFailed:
    error = error_body(response)
    message = str(error.get("message") or "")
    if response.status_code in (400, 413) and any(marker in message.lower() for marker in CONTEXT_MARKERS):
        return AttemptFailed("context_overflow", message)
    return http_failure(response, f"HTTP {response.status_code}" + (f" ({error.get('type')}): {message}" if error else ""))


def _append(out: list[dict[str, Any]], role: str, block: dict[str, Any]) -> None:
    """Messages alternate roles: a block of the same role as the last message joins it."""
    if out and out[-1]["role"] == role:
        out[-1]["content"].append(block)
    else:
        out.append({"role": role, "content": [block]})


def wire_messages(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The round's history in Messages API turns (tool results are user-turn blocks)."""
    out: list[dict[str, Any]] = []
    for message in history:
        role = message.get("role")
        if role == "user" and message.get("answers"):
            _append(
                out,
                "user",
                {
                    "type": "tool_result",
                    "tool_use_id": call_id(str(message["answers"])),
                    "content": str(message.get("content", "")),
                },
            )
        elif role == "user":
            _append(out, "user", {"type": "text", "text": str(message.get("content", "")) or "(empty)"})
        elif role == "assistant" and message.get("tool_calls"):
            for call in message["tool_calls"]:
                _append(
                    out,
                    "assistant",
                    {
                        "type": "tool_use",
                        "id": call_id(str(call["id"])),
                        "name": encode_tool(str(call.get("tool"))),
                        "input": call.get("args") or {},
                    },
                )
        elif role == "assistant" and message.get("ask") is not None:
            _append(
                out,
                "assistant",
                {
                    "type": "tool_use",
                    "id": call_id(str(message.get("key"))),
                    "name": encode_tool("oz.ask"),
                    "input": {"question": message["ask"]},
                },
            )
        elif role == "assistant" and "content" in message:
            _append(out, "assistant", {"type": "text", "text": str(message.get("content") or "") or "(empty)"})
        elif role == "tool":
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": call_id(str(message.get("id"))),
                "content": str(message.get("content", "")),
            }
            if message.get("ok") is False:
                block["is_error"] = True
            _append(out, "user", block)
    return out


def _events(lines: Iterator[str]) -> Iterator[tuple[str, Any]]:
    """Server-sent events: `event:` and `data:` lines, a blank line ends an event."""
    name = ""
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                raw = "\n".join(data)
                try:
                    payload = json.loads(raw)
                except ValueError:
                    raise AttemptFailed("malformed", f"a streamed event is not JSON: {raw[:200]}") from None
                yield name or str(payload.get("type", "")), payload
            name, data = "", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)
    if data:
        try:
            yield name, json.loads("\n".join(data))
        except ValueError:
            raise AttemptFailed("malformed", "the stream's last event is not JSON") from None


def read_stream(events: Iterator[tuple[str, Any]]) -> ProviderAnswer:
    """Assemble a streamed Messages answer into a ProviderAnswer, or the AttemptFailed it amounts to."""
    usage = {"input_tokens": 0, "output_tokens": 0}
    blocks: dict[int, dict[str, Any]] = {}
    stop_reason: str | None = None
    stop_details: Mapping[str, Any] = {}
    finished = False
    for name, payload in events:
        if not isinstance(payload, Mapping):
            continue
        if name == "error" or payload.get("type") == "error":
            error = payload.get("error") if isinstance(payload.get("error"), Mapping) else {}
            assert isinstance(error, Mapping)
            word = str(error.get("type") or "error")
            raise AttemptFailed("stream_error", str(error.get("message") or word), word=word, usage=usage)
        if name == "message_start":
            message = payload.get("message") or {}
            _add_usage(usage, message.get("usage") or {})
        elif name == "content_block_start":
            block = dict(payload.get("content_block") or {})
            block["_json"] = ""
            blocks[int(payload.get("index", len(blocks)))] = block
        elif name == "content_block_delta":
            block = blocks.setdefault(int(payload.get("index", 0)), {"type": "text", "text": "", "_json": ""})
            delta = payload.get("delta") or {}
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + str(delta.get("text", ""))
            elif delta.get("type") == "input_json_delta":
                block["_json"] += str(delta.get("partial_json", ""))
        elif name == "message_delta":
            delta = payload.get("delta") or {}
            stop_reason = delta.get("stop_reason") or stop_reason
            if isinstance(delta.get("stop_details"), Mapping):
                stop_details = delta["stop_details"]
            _add_usage(usage, payload.get("usage") or {}, replace_output=True)
        elif name == "message_stop":
            finished = True
    if not finished:
        raise AttemptFailed("transport", "the stream ended before message_stop", usage=usage)
    texts = [b.get("text", "") for _, b in sorted(blocks.items()) if b.get("type") == "text"]
    uses = [b for _, b in sorted(blocks.items()) if b.get("type") == "tool_use"]
    text = "".join(texts)
    if stop_reason == "refusal":
        category = stop_details.get("category") if isinstance(stop_details, Mapping) else None
        raise AttemptFailed(
            "refusal",
            str(stop_details.get("explanation") or "the model refused"),
            refusal="classifier",
            category=str(category) if category else None,
            usage=usage,
        )
    if stop_reason == "model_context_window_exceeded" or (stop_reason == "max_tokens" and not text and not uses):
        raise AttemptFailed("context_overflow", "the model ran out of room before answering", usage=usage)
    if stop_reason not in NORMAL_STOP:
        raise AttemptFailed("finish_error", f"the provider stopped with {stop_reason!r}", word=str(stop_reason), usage=usage)
    calls: list[dict[str, Any]] = []
    ask: str | None = None
    for block in uses:
        if not isinstance(block.get("name"), str):
            raise AttemptFailed("malformed", "a tool_use block names no tool", usage=usage)
        tool = decode_tool(block["name"])
        args = parse_arguments(block["_json"] if block["_json"] else block.get("input") or {}, tool, usage)
        if tool == "oz.ask":
            ask = ask_question(args)
            continue
        calls.append({"tool": tool, "args": args})
    if ask is not None and not any(c["tool"] == "oz.fail" for c in calls):
        return ProviderAnswer(ask=ask, usage=usage, finish=str(stop_reason))
    if calls:
        return ProviderAnswer(tool_calls=calls, usage=usage, finish=str(stop_reason))
    return ProviderAnswer(text=text, usage=usage, finish=str(stop_reason))


def _add_usage(usage: dict[str, int], more: Mapping[str, Any], *, replace_output: bool = False) -> None:
    if more.get("input_tokens") is not None and int(more["input_tokens"]) > 0:
        usage["input_tokens"] = int(more["input_tokens"])
    if more.get("output_tokens") is not None:
        value = int(more["output_tokens"])
        usage["output_tokens"] = value if replace_output else usage["output_tokens"] + value
