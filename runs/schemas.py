"""Typed shapes of the JSON API for the OpenAPI document (API.md). Shapes may grow, so
every output schema allows extra fields."""

from __future__ import annotations

from typing import Any, Literal

from ninja import Schema
from pydantic import ConfigDict, Field


class Open(Schema):
    model_config = ConfigDict(extra="allow")


class ErrorBody(Schema):
    key: str
    detail: str = ""


class ErrorOut(Schema):
    error: ErrorBody


class TaskIn(Open):
    key: str
    kind: Literal["tool", "round", "await", "join", "delegate"]
    after: list[str] = Field(default_factory=list)
    on_failure: Literal["propagate", "absorb", "halt"] = "propagate"
    tool: str | None = None
    args: dict[str, Any] | None = None
    model: str | None = None
    fallback_models: list[str] | None = None
    prompt: str | None = None
    tools: list[str] | None = None
    script: Any = None
    question: str | None = None
    timeout_s: float | None = None
    mode: Literal["all", "any", "quorum"] | None = None
    quorum: int | None = None


class ApprovalRule(Schema):
    tool: str
    decision: Literal["allow", "deny"]


class ApprovalIn(Schema):
    mode: Literal["bypass", "ask", "rules"] = "ask"
    rules: list[ApprovalRule] = Field(default_factory=list)


class RetryIn(Schema):
    budget: int = 0


class CreateIn(Schema):
    agent: str | None = None
    input: Any = None
    tasks: list[TaskIn] | None = None
    deliverable: str | None = None
    approval: ApprovalIn | None = None
    retry: RetryIn | None = None
    private: bool = False


class AppendIn(Schema):
    tasks: list[TaskIn]
    deliverable: str | None = None


class ReasonIn(Schema):
    reason: str = ""


class ValueIn(Schema):
    value: Any = None


class ResolveIn(Schema):
    """A client await's bearer proof in the body, where access logs do not keep it: its value, or
    that what it waited on failed (`error`: the await fails with await_failed and these words)."""

    token: str
    value: Any = None
    error: str | None = None


class AwaitOutcomeIn(Schema):
    value: Any = None
    # What the await waited on failed: the await fails with await_failed and these words.
    error: str | None = None


class TaskError(Schema):
    key: str | None
    detail: str | None = None


class Failure(Schema):
    kind: str
    retryable: bool
    partial: bool
    person: bool
    message: str | None
    declared: bool


class Attention(Schema):
    reason: str
    blocked_task_keys: list[str]
    # The failure kinds a hold holds on (empty for a question, or a hold with no failure behind it).
    kinds: list[str] = Field(default_factory=list)


class TaskOut(Open):
    key: str
    kind: str
    status: str
    after: list[str]
    on_failure: str
    attempt: int
    error: TaskError | None = None
    # A failed, timed-out or uncertain task's failure: its kind and flags, its words when readable (F10, F11).
    failure: Failure | None = None
    failure_resolution: str | None = None
    result: dict[str, Any] | None = None


class RunOut(Open):
    id: str
    workspace: str
    agent: str | None = None
    agent_version: int | None = None
    status: str
    attention: Attention | None = None
    announcements: list[str]
    deliverable: str | None = None
    output: Any = None
    error: str | None = None
    failure: Failure | None = None
    tasks: list[TaskOut]


class RunSummaryOut(Open):
    id: str
    workspace: str
    status: str
    attention: Attention | None = None
    failure: Failure | None = None


class Receipt(Schema):
    tokens: dict[str, str]


class RunCreated(Schema):
    run: RunOut
    receipt: Receipt


class RunOnly(Schema):
    run: RunOut


class TraceEventOut(Open):
    seq: int
    at: str
    task: str | None = None
    event: str
    from_: str | None = Field(None, alias="from")
    to: str | None = None
    error: TaskError | None = None
    actor: str = ""
    # What the event carries (provider calls: request, answer, tokens); redacted for viewers.
    data: dict[str, Any] | None = None


class TraceOut(Schema):
    events: list[TraceEventOut]


class WaitOut(Open):
    status: str
    attention: Attention | None = None
    last_seq: int
    events: list[TraceEventOut]


class RunPage(Schema):
    count: int
    items: list[RunSummaryOut]
    next: str | None = None


class EffectCount(Schema):
    id: str
    count: int
