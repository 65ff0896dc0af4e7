from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

FailureKind = Literal[
    "http",  # an HTTP error status (`http_status`, maybe `retry_after`)
    "transport",  # connection reset, timeout, a broken stream
    "stream_error",  # an error event inside a stream (`word`, e.g. overloaded_error)
    "refusal",  # the provider declined: `category` "classifier" or "blocked"
    "finish_error",  # an abnormal generation finish (`word`)
    "context_overflow",  # refused for length
    "malformed",  # an answer the round cannot read
]


@dataclass
class ProviderRequest:
    route: str
    model: str
    system: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    # The script provider's cursor: how many calls this lineage has made on this route.
    call_index: int = 0
    script: Any = None


@dataclass
class ProviderAnswer:
    text: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    ask: str | None = None
    oz_fail: dict[str, Any] | None = None
    usage: dict[str, int] = field(default_factory=dict)
    finish: str = "stop"
    raw: dict[str, Any] | None = None


class AttemptFailed(Exception):
    def __init__(
        self,
        kind: FailureKind,
        detail: str = "",
        *,
        http_status: int | None = None,
        retry_after: float | None = None,
        word: str | None = None,
        category: str | None = None,
        refusal: str | None = None,
        usage: dict[str, int] | None = None,
    ) -> None:
        super().__init__(detail or kind)
        self.kind = kind
        self.detail = detail
        self.http_status = http_status
        self.retry_after = retry_after
        self.word = word
        # A refusal's type: "classifier" (may switch routes) or "blocked" (content protection).
        self.refusal = refusal
        # The provider's own category for a refusal, when it gives one.
        self.category = category
        self.usage = usage or {}


class Provider(Protocol):
    name: str
    # Whether the lane offers tool calls (model_capability_unavailable when a round declares tools and it does not).
    tool_calls: bool

    def complete(self, request: ProviderRequest) -> ProviderAnswer: ...


def route_provider_name(route: str) -> str:
    return route.split(":", 1)[0]
