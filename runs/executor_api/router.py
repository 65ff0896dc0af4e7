"""The executor part of the JSON API (API.md "Executors"): register, claim, heartbeat, result, revoke.

Registering uses a person's token (or session); everything after uses the executor's own
bearer token, which this router checks itself.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router, Schema, Status
from ninja.security import HttpBearer

from oz0site.auth import person_auth
from runs import kernel
from runs.api import body_of, fields_of, shaped_body
from runs.executor_api import service
from runs.kernel import Forbidden
from runs.schemas import ErrorOut

router = Router(tags=["executors"])

ERRORS: dict[int, Any] = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut}


class ExecutorAuth(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> Any:
        executor = service.authenticate(token)
        if executor is not None:
            request.executor = executor  # type: ignore[attr-defined]
            # A call's result carries its output: the row store's cap, not a verb's.
            request._oz0_body_max = kernel.MAX_PAYLOAD_BYTES  # type: ignore[attr-defined]
        return executor


class ExecutorRegisteredOut(Schema):
    id: str
    token: str
    name: str
    tools: list[str]
    workspace: str | None
    lease_seconds: float


class CallOut(Schema):
    call: str
    run: str
    task: str
    tool: str
    args: dict[str, Any]
    attempt: int
    lease_seconds: float
    lease_expires_at: str


class HeartbeatOut(Schema):
    held: bool
    cancel: bool


class AcceptedOut(Schema):
    accepted: bool


class RevokedOut(Schema):
    id: str
    revoked: bool
    failed_calls: int


@router.post(
    "/executors",
    response={201: ExecutorRegisteredOut, **ERRORS},
    auth=person_auth("operator", where="any", rate="write"),
    summary="Register an executor (S8)",
    openapi_extra=shaped_body(kernel.REGISTER_BODY),
)
def register(request: HttpRequest) -> Status[dict[str, Any]]:
    body = fields_of(request, kernel.REGISTER_BODY)
    registered = service.register(
        user=request.user, tools=body["tools"], name=body.get("name", ""), workspace=body.get("workspace")
    )
    executor = registered.executor
    return Status(
        201,
        {
            "id": str(executor.pk),
            "token": registered.token,
            "name": executor.name,
            "tools": executor.tools,
            "workspace": executor.workspace.slug if executor.workspace else None,
            "lease_seconds": kernel.lease_seconds(),
        },
    )


@router.post(
    "/executors/{executor_id}/claim",
    response={200: CallOut, 204: None, **ERRORS},
    auth=ExecutorAuth(),
    summary="Claim an advertised call",
)
def claim(request: HttpRequest, executor_id: str) -> Any:
    call = service.claim(request.executor, executor_id)  # type: ignore[attr-defined]
    if call is None:
        return Status(204, None)
    return Status(
        200,
        {
            "call": str(call.task_id),
            "run": call.run_id,
            "task": call.key,
            "tool": call.tool,
            "args": call.args,
            "attempt": call.attempt,
            "lease_seconds": kernel.lease_seconds(),
            "lease_expires_at": call.lease_expires_at.isoformat(),
        },
    )


@router.post(
    "/executors/{executor_id}/calls/{call}/heartbeat",
    response={200: HeartbeatOut, **ERRORS},
    auth=ExecutorAuth(),
    summary="Renew a call's lease",
)
def heartbeat(request: HttpRequest, executor_id: str, call: str) -> dict[str, Any]:
    cancel = service.heartbeat(request.executor, executor_id, call)  # type: ignore[attr-defined]
    return {"held": True, "cancel": cancel}


@router.post(
    "/executors/{executor_id}/calls/{call}/result",
    response={200: AcceptedOut, **ERRORS},
    auth=ExecutorAuth(),
    summary="Report a call's result",
    openapi_extra=shaped_body(kernel.RESULT_BODY),
)
def result(request: HttpRequest, executor_id: str, call: str) -> dict[str, Any]:
    """The body's one validator is the kernel's shape (kernel.RESULT_BODY), checked by the service."""
    service.report(request.executor, executor_id, call, body_of(request))  # type: ignore[attr-defined]
    return {"accepted": True}


@router.delete(
    "/executors/{executor_id}",
    response={200: RevokedOut, **ERRORS},
    auth=[ExecutorAuth(), *person_auth()],
    summary="Revoke an executor (S8)",
)
def revoke(request: HttpRequest, executor_id: str) -> Any:
    executor = getattr(request, "executor", None)
    if executor is None and not request.user.is_authenticated:
        raise Forbidden()
    target, failed = service.revoke(executor_id=executor_id, user=None if executor else request.user, executor=executor)
    return {"id": str(target.pk), "revoked": True, "failed_calls": failed}
