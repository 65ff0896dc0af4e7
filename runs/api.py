"""The runs part of the JSON API: create, append, read, wait, and the verbs (API.md)."""

from __future__ import annotations

import asyncio
from typing import Any

from django.http import HttpRequest
from ninja import Query, Router, Status

from oz0site.auth import person_auth
from runs import idempotency, kernel, run_list, selectors, waits
from runs.kernel import MAX_PAYLOAD_BYTES, BodyShape, InvalidRequest
from runs.permissions import can_read_content
from runs.schemas import (
    Appended,
    ErrorOut,
    RunCreated,
    RunOnly,
    RunOut,
    RunPage,
    TraceOut,
    WaitOut,
    read_body,
)

router = Router(tags=["runs"])

# Each route's standing, rate and body cap, checked before its body is read (oz0site/auth.py).
OPERATE_WS = person_auth("operator", where="ws", body_max=MAX_PAYLOAD_BYTES, rate="write")
OPERATE_BUILD = person_auth("operator", where="run_id", body_max=MAX_PAYLOAD_BYTES, rate="write")
OPERATE_RUN = person_auth("operator", where="run_id", rate="write")
# An approval may carry the edited arguments of a call, which a model's call may make as large as a payload.
APPROVE_RUN = person_auth("operator", where="run_id", body_max=MAX_PAYLOAD_BYTES, rate="write")
# An await's token names its workspace: a member anywhere gets the kernel's answer (404 or 403).
RESOLVE_AWAIT = person_auth("viewer", where="any", rate="write", missing="await")
READ_WS = person_auth("viewer", where="ws", rate="read")
READ_RUN = person_auth("viewer", where="run_id")
WAIT_RUN = person_auth("viewer", where="run_id", shared=False)
READ_RUN_EXPENSIVE = person_auth("viewer", where="run_id", rate="read")

ERRORS: dict[int, Any] = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut, 413: ErrorOut, 429: ErrorOut}


def body_of(request: HttpRequest) -> Any:
    """The request body, parsed once, refusing what the row store cannot hold (S30, S31)."""
    cached = getattr(request, "_oz0_body", None)
    if cached is None:
        cached = read_body(request)
        request._oz0_body = cached  # type: ignore[attr-defined]
    return cached


def body_fields(request: HttpRequest) -> dict[str, Any]:
    """The request body as a JSON object; an empty body is `{}`, any other shape a typed 400."""
    body = body_of(request)
    if not body:
        return {}
    if not isinstance(body, dict):
        raise InvalidRequest("invalid_request", "the body must be a JSON object")
    return body


def request_body(schema: dict[str, Any], *, required: bool = True) -> dict[str, Any]:
    """A route's body as the OpenAPI document shows it, when the view reads the body itself (the
    kernel validates it, and wrote `schema`): ninja then neither parses nor validates it."""
    return {"requestBody": {"required": required, "content": {"application/json": {"schema": schema}}}}


def shaped_body(shape: BodyShape) -> dict[str, Any]:
    """A verb's body as the document shows it: the kernel's shape, whose `read_fields` checks it."""
    return request_body(kernel.body_schema(shape), required=not shape.optional)


def fields_of(request: HttpRequest, shape: BodyShape) -> dict[str, Any]:
    """The request's body checked against a verb's shape by the kernel (typed 400s). No body at
    all is an optional shape's empty one, and a required shape's refusal."""
    body = body_of(request)
    return kernel.read_fields(shape, body if request.body.strip() else None)


def _document(request: HttpRequest, run: Any) -> dict[str, Any]:
    run = selectors.run_for(request.user, run.pk)
    return selectors.run_document(request.user, run)


@router.post(
    "/workspaces/{ws}/runs",
    auth=OPERATE_WS,
    response={201: RunCreated, **ERRORS},
    summary="Create a run",
    openapi_extra={**idempotency.OPENAPI, **request_body(kernel.create_body_schema())},
)
@idempotency.idempotent(idempotency.workspace_named)
def create_run(request: HttpRequest, ws: str) -> Status[dict[str, Any]]:
    """The body's one validator is the kernel's compile (runs.kernel.request_shapes.CREATE_FIELDS), which
    also writes the document's schema for it; the route's auth checked standing before the body."""
    workspace = selectors.workspace_for(request.user, ws)
    body = body_of(request)
    run, receipt = kernel.create_run(workspace=workspace, user=request.user, body=body)
    document = _document(request, run)
    return Status(201, {"run": document, "receipt": _receipt(receipt, body, document["last_seq"])})


@router.get("/workspaces/{ws}/runs", auth=READ_WS, response={200: RunPage, **ERRORS}, summary="List a workspace's runs")
def list_runs(
    request: HttpRequest,
    ws: str,
    status: str | None = None,
    agent: str | None = None,
    creator: str | None = None,
    run: str | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> dict[str, Any]:
    """Newest first; `status` (comma separated), `agent`, `creator` (a username) and `run` (an id
    or its first hex digits) narrow the list. `next` pages the same filter only."""
    workspace = selectors.workspace_for(request.user, ws)
    run_filter = run_list.parse_run_filter({"status": status, "agent": agent, "creator": creator, "run": run})
    return run_list.runs_page(request.user, workspace, run_filter, cursor=cursor, limit=max(1, min(limit, 200)))


@router.get("/runs/{run_id}", auth=READ_RUN, response={200: RunOut, **ERRORS}, summary="The run document")
def get_run(request: HttpRequest, run_id: str) -> dict[str, Any]:
    run = selectors.run_for(request.user, run_id)
    return selectors.run_document(request.user, run)


@router.post(
    "/runs/{run_id}/append",
    auth=OPERATE_BUILD,
    response={200: Appended, **ERRORS},
    summary="Append tasks (S17)",
    openapi_extra={**idempotency.OPENAPI, **request_body(kernel.append_body_schema())},
)
@idempotency.idempotent(idempotency.workspace_of_run)
def append(request: HttpRequest, run_id: str) -> dict[str, Any]:
    """Answers a receipt and the run's summary, not the whole run document: a client building a run
    of thousands of tasks in appends of 64 would otherwise download the run again on every call
    (quadratic in the run's size). `links.run` is the document, `links.wait` what follows."""
    before = selectors.run_for(request.user, run_id)
    body = body_of(request)
    run, receipt = kernel.append(run_id=run_id, user=request.user, body=body)
    # The run as the append left it; its workspace and agent version are the ones just read.
    run.workspace, run.agent_version = before.workspace, before.agent_version
    seq = run.last_seq
    return {
        "run": selectors.run_summary(run, can_read_content(request.user, run)),
        "receipt": _receipt(receipt, body, seq),
        "links": {"run": f"/api/v1/runs/{run.pk}", "wait": f"/api/v1/runs/{run.pk}/wait?after={seq}"},
    }


def _receipt(receipt: dict[str, Any], body: dict[str, Any], seq: int) -> dict[str, Any]:
    """The kernel's receipt (await tokens) with the keys the request added, in its order, and the
    run's trace seq once the request committed: its events are at or below it."""
    return {**receipt, "keys": [str(t["key"]) for t in body.get("tasks") or []], "seq": seq}


@router.get(
    "/runs/{run_id}/trace",
    auth=READ_RUN_EXPENSIVE,
    response={200: TraceOut, **ERRORS},
    by_alias=True,
    summary="The run's trace, oldest first",
)
def trace(request: HttpRequest, run_id: str, after: int = 0, limit: int = 10_000) -> dict[str, Any]:
    run = selectors.run_for(request.user, run_id)
    return {"events": selectors.trace_documents(request.user, run, after=after, limit=max(1, min(limit, 10_000)))}


@router.get(
    "/runs/{run_id}/wait", auth=WAIT_RUN, response={200: WaitOut, **ERRORS}, by_alias=True, summary="Wait for events past a seq"
)
async def wait(
    request: HttpRequest,
    run_id: str,
    after: int = 0,
    timeout: float = Query(30.0, ge=0, le=waits.WAIT_MAX_SECONDS, allow_inf_nan=False),
) -> dict[str, Any]:
    """Blocks until an event past `after` exists or the timeout (at most 60 s) passes.

    While it waits it holds neither a server thread nor a database connection: it sleeps on the
    run's channel-layer group. A user has at most OZ0_WAITS_PER_USER waits open (429 past it)."""
    user = request.user
    run = await waits.read(selectors.run_for, user, run_id)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + waits.clamp_timeout(timeout)
    if run.last_seq <= after and loop.time() < deadline:
        async with waits.slot(user), waits.wakeup(run.pk) as wakeup:
            while True:
                run = await waits.read(selectors.run_for, user, run_id)
                remaining = deadline - loop.time()
                if run.last_seq > after or remaining <= 0:
                    break
                await wakeup.sleep(remaining)
    return await waits.read(_wait_document, user, run, after)


def _wait_document(user: Any, run: Any, after: int) -> dict[str, Any]:
    content = can_read_content(user, run)
    summary = selectors.run_summary(run, content)
    events = [selectors.event_document(e, content) for e in selectors.trace_events(run, after=after, limit=1000)]
    return {**summary, "events": events}


def _verb(request: HttpRequest, run_id: str, action: Any, **kwargs: Any) -> dict[str, Any]:
    selectors.run_for(request.user, run_id)
    run = action(run_id=run_id, user=request.user, **kwargs)
    return {"run": _document(request, run)}


@router.post(
    "/runs/{run_id}/tasks/{key}/retry",
    auth=OPERATE_RUN,
    response={200: RunOnly, **ERRORS},
    summary="Retry a failed task (S14-S16)",
    openapi_extra=shaped_body(kernel.RETRY_BODY),
)
def retry(request: HttpRequest, run_id: str, key: str) -> dict[str, Any]:
    """A harnessed round that already made non-replayable calls answers 409
    `nonreplayable_calls_made` with the calls listed (`error.calls`) unless `confirm_calls` names
    each of them."""
    confirm_calls = fields_of(request, kernel.RETRY_BODY).get("confirm_calls")
    return _verb(request, run_id, kernel.retry, key=key, confirm_calls=confirm_calls)


@router.post(
    "/runs/{run_id}/tasks/{key}/abandon",
    auth=OPERATE_RUN,
    response={200: RunOnly, **ERRORS},
    summary="Abandon a failed task (S14-S16)",
)
def abandon(request: HttpRequest, run_id: str, key: str) -> dict[str, Any]:
    return _verb(request, run_id, kernel.abandon, key=key)


@router.post(
    "/runs/{run_id}/tasks/{key}/compact",
    auth=OPERATE_RUN,
    response={200: RunOnly, **ERRORS},
    summary="Compact a round (S14, S23)",
)
def compact(request: HttpRequest, run_id: str, key: str) -> dict[str, Any]:
    return _verb(request, run_id, kernel.compact, key=key)


@router.post(
    "/runs/{run_id}/tasks/{key}/approve",
    auth=APPROVE_RUN,
    response={200: RunOnly, **ERRORS},
    summary="Approve a tool call, as it is or with edited arguments (S5, S6)",
    openapi_extra=shaped_body(kernel.APPROVE_BODY),
)
def approve(request: HttpRequest, run_id: str, key: str) -> dict[str, Any]:
    """Given the `digest` the approver saw (the inbox item's), a call that changed since answers
    409 `approval_stale` and nothing changes. Given `args` too, the call runs with those arguments
    instead (the console's edit-then-approve, `kernel.approve_edited`): its own digest, the trace's
    verb event holding both calls, the model told who edited them; refused, changing nothing, for a
    framework's own tool (409 `not_editable`), an edit a rule of the run denies
    (`edit_denied_by_rule`) or one that changes whether the call is replayable
    (`edit_changes_replayability`)."""
    body = fields_of(request, kernel.APPROVE_BODY)
    if body.get("args") is not None:
        return _verb(request, run_id, kernel.approve_edited, key=key, digest=body.get("digest"), args=body["args"])
    return _verb(request, run_id, kernel.approve, key=key, digest=body.get("digest"))


@router.post(
    "/runs/{run_id}/tasks/{key}/deny",
    auth=OPERATE_RUN,
    response={200: RunOnly, **ERRORS},
    summary="Deny a tool call (S5, S6)",
    openapi_extra=shaped_body(kernel.REASON_BODY),
)
def deny(request: HttpRequest, run_id: str, key: str) -> dict[str, Any]:
    reason = fields_of(request, kernel.REASON_BODY).get("reason", "")
    return _verb(request, run_id, kernel.deny, key=key, reason=reason)


@router.post(
    "/runs/{run_id}/tasks/{key}/answer",
    auth=OPERATE_RUN,
    response={200: RunOnly, **ERRORS},
    summary="Answer a model's question (S9)",
    openapi_extra=shaped_body(kernel.ANSWER_BODY),
)
def answer(request: HttpRequest, run_id: str, key: str) -> dict[str, Any]:
    return _verb(request, run_id, kernel.answer, key=key, value=fields_of(request, kernel.ANSWER_BODY).get("value"))


@router.post(
    "/awaits",
    auth=RESOLVE_AWAIT,
    response={200: RunOnly, **ERRORS},
    summary="Resolve a client await with its token (S8, S32)",
    openapi_extra=shaped_body(kernel.RESOLVE_BODY),
)
def resolve_await(request: HttpRequest) -> dict[str, Any]:
    """The token rides in the body, so access logs never hold it; resolving needs write standing
    in the await's workspace, as every write surface does. The body gives the await its `value`,
    or says what it waited on failed (`error`: await_failed)."""
    body = fields_of(request, kernel.RESOLVE_BODY)
    run = kernel.resolve_await(token=body.get("token"), user=request.user, value=body.get("value"), error=body.get("error"))
    return {"run": _document(request, run)}


@router.post(
    "/awaits/{token}",
    auth=RESOLVE_AWAIT,
    response={200: RunOnly, **ERRORS},
    summary="Resolve a client await with its token in the path (S8)",
    openapi_extra=shaped_body(kernel.AWAIT_OUTCOME_BODY),
)
def resolve_await_by_path(request: HttpRequest, token: str) -> dict[str, Any]:
    """API.md's form; prefer POST /awaits with the token in the body, which stays out of access logs."""
    body = fields_of(request, kernel.AWAIT_OUTCOME_BODY)
    run = kernel.resolve_await(token=token, user=request.user, value=body.get("value"), error=body.get("error"))
    return {"run": _document(request, run)}


@router.post(
    "/runs/{run_id}/cancel",
    auth=OPERATE_RUN,
    response={200: RunOnly, **ERRORS},
    summary="Cancel a run",
    openapi_extra=shaped_body(kernel.REASON_BODY),
)
def cancel(request: HttpRequest, run_id: str) -> dict[str, Any]:
    reason = fields_of(request, kernel.REASON_BODY).get("reason", "")
    return _verb(request, run_id, kernel.cancel_run, reason=reason)


@router.post("/runs/{run_id}/pause", auth=OPERATE_RUN, response={200: RunOnly, **ERRORS}, summary="Pause dispatching")
def pause(request: HttpRequest, run_id: str) -> dict[str, Any]:
    return _verb(request, run_id, kernel.pause_run)


@router.post("/runs/{run_id}/resume", auth=OPERATE_RUN, response={200: RunOnly, **ERRORS}, summary="Resume dispatching")
def resume(request: HttpRequest, run_id: str) -> dict[str, Any]:
    return _verb(request, run_id, kernel.resume_run)
