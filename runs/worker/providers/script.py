"""The `script` provider: deterministic answers from the round's own script (API.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runs.worker.providers.base import AttemptFailed, ProviderAnswer, ProviderRequest


def script_for(script: Any, route: str) -> list[Any]:
    if isinstance(script, Mapping):
        answers = script.get(route)
        return list(answers) if isinstance(answers, list) else []
    return list(script or [])


class ScriptProvider:
    name = "script"
    tool_calls = True

    def complete(self, request: ProviderRequest) -> ProviderAnswer:
        answers = script_for(request.script, request.route)
        if request.call_index >= len(answers):
            raise AttemptFailed("finish_error", "the script has no answer left", word="script_exhausted")
        answer = answers[request.call_index]
        if not isinstance(answer, Mapping):
            raise AttemptFailed("malformed", f"script answer {request.call_index + 1} is not an object")
        usage = {"input_tokens": sum(len(str(m.get("content", ""))) for m in request.messages) // 4 + 1, "output_tokens": 1}
        # Text beside tool calls is the model's words with them (what an approver reads).
        if "text" in answer and "tool_calls" not in answer:
            return ProviderAnswer(text=str(answer["text"]), usage={**usage, "output_tokens": len(str(answer["text"])) // 4 + 1})
        if "tool_calls" in answer:
            calls = answer["tool_calls"]
            if not isinstance(calls, list):
                raise AttemptFailed("malformed", "tool_calls is not a list", usage=usage)
            return ProviderAnswer(
                tool_calls=[dict(c) if isinstance(c, Mapping) else {"tool": None} for c in calls],
                text=str(answer["text"]) if "text" in answer else None,
                usage=usage,
                finish="tool_calls",
            )
        if "ask" in answer:
            return ProviderAnswer(ask=str(answer["ask"]), usage=usage)
        if "oz_fail" in answer:
            fail = answer["oz_fail"] if isinstance(answer["oz_fail"], Mapping) else {}
            return ProviderAnswer(oz_fail={"kind": fail.get("kind"), "message": fail.get("message")}, usage=usage)
        if "http" in answer:
            raise AttemptFailed(
                "http",
                f"HTTP {answer['http']}",
                http_status=int(answer["http"]),
                retry_after=float(answer["retry_after"]) if answer.get("retry_after") is not None else None,
            )
        if "stream_error" in answer:
            raise AttemptFailed("stream_error", str(answer["stream_error"]), word=str(answer["stream_error"]))
        if "refusal" in answer:
            raise AttemptFailed(
                "refusal",
                f"refused ({answer['refusal']})",
                refusal=str(answer["refusal"]),
                category=str(answer.get("category")) if answer.get("category") is not None else None,
                usage=usage,
            )
        if "finish" in answer:
            raise AttemptFailed(
                "finish_error", f"finish {answer['finish']}", word=str(answer.get("word", answer["finish"])), usage=usage
            )
        if answer.get("context_overflow"):
            raise AttemptFailed("context_overflow", "the request is too long for the model", usage=usage)
        raise AttemptFailed("malformed", f"script answer {request.call_index + 1} has no known field")
