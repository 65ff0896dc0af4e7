"""The OpenAI Chat Completions provider (and any OpenAI-compatible server): one attempt per call."""

from __future__ import annotations

import json
from collections.abc import Mapping
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

NORMAL_FINISH = ("stop", "tool_calls", "function_call")
CONTEXT_CODES = ("context_length_exceeded", "string_above_max_length")


class OpenAIProvider(HttpProvider):
    def complete(self, request: ProviderRequest) -> ProviderAnswer:
        body = self.body(request)
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        try:
            with self.client() as client:
                response = client.post(f"{self.base_url}/chat/completions", json=body, headers=headers)
        except httpx.HTTPError as error:
            raise AttemptFailed("transport", f"{type(error).__name__}: {error}") from None
        if response.status_code != 200:
            raise _status_failure(response)
        try:
            payload = response.json()
        except ValueError:
            raise AttemptFailed("malformed", "the provider's answer is not JSON") from None
        return read_completion(payload)

    def body(self, request: ProviderRequest) -> dict[str, Any]:
        messages: list[dict[str, Any]] = []
        if request.system:
            messages.append({"role": "system", "content": request.system})
        messages.extend(wire_messages(request.messages))
        body: dict[str, Any] = {"model": request.model, "messages": messages}
        if self.max_tokens_configured:
            body["max_tokens"] = self.max_tokens
        tools = with_builtins(list(request.tools))
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": encode_tool(t["name"]),
                    "description": t.get("description", ""),
                    "parameters": t.get("parameters") or {"type": "object"},
                },
            }
            for t in tools
        ]
        return body


def _status_failure(response: httpx.Response) -> AttemptFailed:
    error = error_body(response)
    code = str(error.get("code") or "")
    message = str(error.get("message") or "")
    if response.status_code == 400 and (code in CONTEXT_CODES or "context length" in message.lower()):
        return AttemptFailed("context_overflow", message or "the request is too long for the model")
    return http_failure(
        response, f"HTTP {response.status_code}" + (f" ({code or error.get('type')}): {message}" if error else "")
    )


def wire_messages(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The round's history in Chat Completions messages."""
    out: list[dict[str, Any]] = []
    for message in history:
        role = message.get("role")
        if role == "user" and message.get("answers"):
            out.append(
                {"role": "tool", "tool_call_id": call_id(str(message["answers"])), "content": str(message.get("content", ""))}
            )
        elif role == "user":
            out.append({"role": "user", "content": str(message.get("content", ""))})
        elif role == "assistant" and message.get("tool_calls"):
            out.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call_id(str(call["id"])),
                            "type": "function",
                            "function": {
                                "name": encode_tool(str(call.get("tool"))),
                                "arguments": json.dumps(call.get("args") or {}),
                            },
                        }
                        for call in message["tool_calls"]
                    ],
                }
            )
        elif role == "assistant" and message.get("ask") is not None:
            arguments = json.dumps({"question": message["ask"]})
            out.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call_id(str(message.get("key"))),
                            "type": "function",
                            "function": {"name": encode_tool("oz.ask"), "arguments": arguments},
                        }
                    ],
                }
            )
        elif role == "assistant" and "content" in message:
            out.append({"role": "assistant", "content": str(message.get("content") or "")})
        elif role == "tool":
            out.append(
                {"role": "tool", "tool_call_id": call_id(str(message.get("id"))), "content": str(message.get("content", ""))}
            )
    return out


def _usage(payload: Mapping[str, Any]) -> dict[str, int]:
    usage = payload.get("usage") if isinstance(payload.get("usage"), Mapping) else {}
    assert isinstance(usage, Mapping)
    return {"input_tokens": int(usage.get("prompt_tokens") or 0), "output_tokens": int(usage.get("completion_tokens") or 0)}


def read_completion(payload: Any) -> ProviderAnswer:
    """A Chat Completions answer as a ProviderAnswer, or the AttemptFailed it amounts to."""
    if not isinstance(payload, Mapping):
        raise AttemptFailed("malformed", "the provider's answer is not a JSON object")
    usage = _usage(payload)
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise AttemptFailed("malformed", "the provider's answer has no choices", usage=usage)
    choice = choices[0]
    message = choice.get("message") if isinstance(choice.get("message"), Mapping) else {}
    assert isinstance(message, Mapping)
    finish = str(choice.get("finish_reason") or "stop")
    text = message.get("content")
    raw_calls = message.get("tool_calls") or []
    if message.get("refusal") or finish == "content_filter":
        raise AttemptFailed(
            "refusal", str(message.get("refusal") or "the content filter stopped the answer"), refusal="blocked", usage=usage
        )
    if finish == "length":
        if not text and not raw_calls:
            raise AttemptFailed("context_overflow", "the model ran out of room before answering", usage=usage)
        raise AttemptFailed("finish_error", "the answer was cut off at the length limit", word="length", usage=usage)
    if finish not in NORMAL_FINISH:
        raise AttemptFailed("finish_error", f"the provider finished with {finish!r}", word=finish, usage=usage)
    if not isinstance(raw_calls, list):
        raise AttemptFailed("malformed", "tool_calls is not a list", usage=usage)
    calls: list[dict[str, Any]] = []
    ask: str | None = None
    for raw in raw_calls:
        function = raw.get("function") if isinstance(raw, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise AttemptFailed("malformed", "a tool call names no function", usage=usage)
        tool = decode_tool(function["name"])
        args = parse_arguments(function.get("arguments"), tool, usage)
        if tool == "oz.ask":
            ask = ask_question(args)
            continue
        calls.append({"tool": tool, "args": args})
    if ask is not None and not any(c["tool"] == "oz.fail" for c in calls):
        # A question comes before any other call of the same answer: the calls wait for the answer.
        return ProviderAnswer(ask=ask, usage=usage, finish=finish, raw=dict(payload))
    if calls:
        return ProviderAnswer(tool_calls=calls, usage=usage, finish=finish, raw=dict(payload))
    if text is None:
        raise AttemptFailed("malformed", "the answer has neither text nor tool calls", usage=usage)
    return ProviderAnswer(text=str(text), usage=usage, finish=finish, raw=dict(payload))
