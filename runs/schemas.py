"""Typed shapes of the JSON API for the OpenAPI document (API.md), and how a request body is read.
Shapes may grow, so every output schema allows extra fields.

A body is parsed once (`parse_body`, by the API's parser), refusing what the row store cannot
hold (S30, S31): a number's form is judged on the text the client sent, never on Python's `repr`
of the float it became (`0.00001` is a plain decimal even though `repr(1e-05)` is not).
"""

from __future__ import annotations

import json
import math
import re
from datetime import date, datetime
from typing import Annotated, Any, Generic, Literal, NotRequired, TypeVar

from django.conf import settings
from django.http import HttpRequest
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, with_config
from typing_extensions import TypedDict

from runs.kernel import MAX_DEPTH, MAX_PAYLOAD_BYTES, SLUG_PATTERN, InvalidRequest, KernelError, check_storable


class PayloadTooLarge(KernelError):
    status = 413


def _reject_exponent(literal: str) -> float:
    # The literal is the client's own text: `0.00001` passes though its float's repr is 1e-05.
    if "e" in literal or "E" in literal:
        raise InvalidRequest("exponent_number", f"the number {literal} is in exponent form, which the row store cannot hold")
    number = float(literal)
    if not math.isfinite(number):
        raise InvalidRequest("invalid_number", f"the number {literal[:40]}... is too large to hold")
    return number


def _reject_constant(name: str) -> float:
    raise InvalidRequest("invalid_number", f"{name} is not a number the row store can hold")


def body_cap(request: HttpRequest) -> int:
    """The route's cap on its body: what its auth declared (`oz0site.auth.Route.body_max`), else a
    verb's (`OZ0_VERB_BODY_MAX`); never above the row store's 1 MiB."""
    declared = getattr(request, "_oz0_body_max", None)
    return min(int(declared or settings.OZ0_VERB_BODY_MAX), MAX_PAYLOAD_BYTES)


def refuse_declared_length(request: HttpRequest) -> None:
    """413 when the request's Content-Length is past the route's cap: called by the route's auth,
    before anything reads the body (ninja reads `request.body` before it calls the parser)."""
    cap = body_cap(request)
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = -1
    if declared < 0:
        # Django's own read of the body would raise on it (a 500): a typed 400 instead.
        raise InvalidRequest("invalid_request", "the Content-Length header is not a number of bytes")
    if declared > cap:
        raise PayloadTooLarge("payload_too_large", f"the body is {declared} bytes; this request's cap is {cap}")


def refuse_repeated_parameters(request: HttpRequest) -> None:
    """No parameter of the API takes a list: a query key given twice (`?agent=a&agent=b`) would
    be read as one of its values, chosen silently; it is a typed 400 instead."""
    repeated = sorted(key for key, values in request.GET.lists() if len(values) > 1)
    if repeated:
        raise InvalidRequest(
            "repeated_parameter", f"`{repeated[0][:40]}` is given more than once; each parameter takes one value"
        )


def read_body(request: HttpRequest) -> Any:
    """The request's body, parsed, refused 413 past the route's cap."""
    refuse_declared_length(request)
    return parse_body(request.body, cap=body_cap(request))


def parse_body(raw: bytes, *, cap: int = MAX_PAYLOAD_BYTES) -> Any:
    """Parse a JSON request body, refusing what the row store cannot hold (S30, S31)."""
    if len(raw) > cap:
        raise PayloadTooLarge("payload_too_large", f"the body is {len(raw)} bytes; this request's cap is {cap}")
    if not raw.strip():
        return {}
    try:
        text = raw.decode("utf-8")
        body = json.loads(text, parse_float=_reject_exponent, parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise InvalidRequest("invalid_json", "the body is not UTF-8") from None
    except json.JSONDecodeError as error:
        raise InvalidRequest(
            "invalid_json", f"the body is not JSON: {error.msg} at line {error.lineno} column {error.colno}"
        ) from None
    except RecursionError:
        raise InvalidRequest("too_deep", f"the body nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as error:
        # An integer of more digits than Python converts (4,300).
        raise InvalidRequest("invalid_number", f"the body holds a number that cannot be read: {error}") from None
    check_storable(body)
    return body


# Query parameters as the server reads them, so the OpenAPI document says what it accepts: a
# workspace is a slug (never empty), a moment a date or an RFC 3339 datetime, a version a positive number.
SLUG_QUERY: dict[str, Any] = {"min_length": 1, "max_length": 64, "pattern": SLUG_PATTERN}
TEXT_QUERY: dict[str, Any] = {"min_length": 1, "max_length": 200}
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_DATE_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})")


def _rfc3339_moment(value: Any) -> date | datetime:
    """A moment as the document's `date` and `date-time` formats write it (RFC 3339): pydantic's
    lax reading would take a bare number (`0.5`) for seconds since 1970, which the document
    calls no moment. A date a calendar lacks (2026-02-30) is refused too."""
    if isinstance(value, date):
        return value
    if isinstance(value, str):
        if _DATE.fullmatch(value):
            return date.fromisoformat(value)
        if _DATE_TIME.fullmatch(value):
            return datetime.fromisoformat(value.upper())
    raise ValueError("a moment is a date (YYYY-MM-DD) or an RFC 3339 date-time with its offset (2026-01-31T09:00:00Z)")


# A moment: a date (the whole day) or an RFC 3339 datetime; views hand `moment_text(value)` on.
Moment = Annotated[date | datetime, BeforeValidator(_rfc3339_moment)]


def moment_text(value: date | datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


Item = TypeVar("Item")


class Out(BaseModel):
    """A response shape. (A request's shape is the kernel's: runs.kernel.request_shapes.) The views
    answer dicts the selectors built, so plain pydantic validates them: ninja's Schema would wrap every nested object in its ORM attribute getter, which cost
    more than building the document (a run of 5,000 tasks: 0.35 s of 0.69 s)."""

    model_config = ConfigDict(populate_by_name=True)


class OpenOut(Out):
    model_config = ConfigDict(populate_by_name=True, extra="allow")


class ErrorBody(Out):
    """A typed refusal. Some carry more: `quota_exceeded` its `quota` (the quota's name) and `limit`."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")
    key: str
    detail: str = ""
    # `nonreplayable_calls_made` (a retry of a harnessed round): the calls it already made,
    # `{key, tool, status}` each, which the retry confirms by their keys.
    calls: list[dict[str, Any]] | None = None


class ErrorOut(Out):
    error: ErrorBody


class TaskError(Out):
    key: str | None
    detail: str | None = None


class Failure(Out):
    """F10's failure. It may carry more: a flow failed by a step's failure also says whose words its
    message is (`words_of`: `the agent <name> (job <id>)`, or `oz0`)."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")
    kind: str
    retryable: bool
    partial: bool
    person: bool
    message: str | None
    declared: bool


class Attention(Out):
    reason: str
    blocked_task_keys: list[str]
    # The failure kinds a hold holds on (empty for a question, or a hold with no failure behind it).
    kinds: list[str] = Field(default_factory=list)


def _nullable(model: type[BaseModel]) -> WithJsonSchema:
    return WithJsonSchema({"anyOf": [model.model_json_schema(), {"type": "null"}]})


class FirstApproval(TypedDict):
    """The first of a two-approver call's two approvals: who gave it (a username) and when (RFC 3339)."""

    by: str
    at: str


@with_config(ConfigDict(extra="allow"))
class TaskDocument(TypedDict):
    """A task's document: the one definition of its shape. `runs.selectors.task_document` builds
    it (mypy holds the builder to these keys) and the OpenAPI document shows it (RunOut.tasks)."""

    key: str
    kind: str
    status: str
    after: list[str]
    on_failure: str
    attempt: int
    # Authored by a model (a round's call: it passes the approval stage, S4-S6), and its round's lineage.
    lineage: str
    composed: bool
    error: Annotated[dict[str, Any] | None, _nullable(TaskError)]
    # A failed, timed-out or uncertain task's failure: its kind and flags, its words when readable (F10, F11).
    failure: Annotated[dict[str, Any] | None, _nullable(Failure)]
    failure_resolution: str | None
    result: dict[str, Any] | None
    # What the task does (its tool and args, agent and input, ...): whole for readers the content is
    # open to; for the others only its structure (tool, model, mode, quorum, agent, via).
    spec: dict[str, Any]
    # A delegate task's latest child run: {id, status}.
    child: NotRequired[dict[str, Any]]
    # A call waiting for its second approver (its approver group asks for two, issue 31): the first
    # approval given to the call as it stands (an edit since starts over), as the inbox shows it.
    first_approval: NotRequired[FirstApproval]
    # A harnessed round's session (F7, issue 29): active, released (waiting on a person, its process
    # kept, no thread nor slot held), parked (its state stored, no process), waiting_for_slot,
    # queued, or null once it ended.
    session: NotRequired[Literal["active", "released", "parked", "waiting_for_slot", "queued"] | None]


class ChildOut(Out):
    """A child run (a delegate task's): status, kind and flags; words only for content readers."""

    id: str
    task: str
    agent: str | None = None
    status: str
    depth: int
    failure: Failure | None = None


class RunOut(OpenOut):
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
    tasks: list[TaskDocument]
    # Delegation (F14-F16): the run that started this one, and the runs this one started.
    parent: str | None = None
    parent_task: str | None = None
    children: list[ChildOut] = Field(default_factory=list)
    # Another agent's words reached this run without their labels (F15): its composed calls wait for a person.
    tainted: bool = False
    depth: int = 0
    # 0 (low) to 9 (high): orders the dispatch of its queued calls within its workspace's share.
    priority: int = 5
    priority_name: str = "normal"
    # "canary" or "stable" while its agent's canary rollout was under way when it was created.
    rollout: str | None = None
    # The run's input, for readers its content is open to (`content_visible`); null for the others.
    input: Any = None
    content_visible: bool = False
    private: bool = False
    usage: dict[str, int] = Field(default_factory=dict)
    # The run's model calls priced (genai-prices): tokens, calls, `cost_usd` (text, or null when no
    # model of the run has a known price) and `unpriced_models`.
    cost: dict[str, Any] | None = None
    # The version of the agent's code (its digest when the run was created, its version's, whether
    # the code changed under the same manifest, the rounds that loaded other code), else null.
    code: dict[str, Any] | None = None
    code_digest: str | None = None
    # A harnessed round queued for a session thread its workspace has none free of (F7):
    # `{task, since, slots}` (slots: OZ0_SESSION_SLOTS_PER_WORKSPACE), else null.
    waiting_for_slot: dict[str, Any] | None = None
    created_at: str | None = None
    updated_at: str | None = None
    finished_at: str | None = None
    last_seq: int = 0


class RunSummaryOut(OpenOut):
    id: str
    workspace: str
    status: str
    attention: Attention | None = None
    failure: Failure | None = None


class Receipt(Out):
    tokens: dict[str, str]
    # The task keys the request added (in its order), and the run's trace seq once it committed.
    keys: list[str] = Field(default_factory=list)
    seq: int = 0


class RunSummary(OpenOut):
    id: str
    workspace: str
    status: str
    attention: Attention | None = None
    failure: Failure | None = None
    deliverable: str | None = None
    last_seq: int


class AppendLinks(Out):
    run: str
    wait: str


class Appended(Out):
    """An append's answer: the run's summary (no tasks), the receipt, and where to read on."""

    run: RunSummary
    receipt: Receipt
    links: AppendLinks


class RunCreated(Out):
    run: RunOut
    receipt: Receipt


class RunOnly(Out):
    run: RunOut


class TraceEventOut(OpenOut):
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


class TraceOut(Out):
    events: list[TraceEventOut]


class WaitOut(OpenOut):
    status: str
    attention: Attention | None = None
    last_seq: int
    events: list[TraceEventOut]


class Page(Out, Generic[Item]):
    """A cursor page, the one definition every list answers: its items, and the cursor of the next
    page (null on the last), which the selectors encode (`runs.selectors.encode_cursor`)."""

    items: list[Item]
    next: str | None = None


class RunPage(Page[RunSummaryOut]):
    # The runs list alone counts what matches (the console's pager shows it).
    count: int
