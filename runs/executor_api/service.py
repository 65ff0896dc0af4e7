"""Executors (runners): tools served outside the workers, on a person's machine (S8, S10).

The service functions behind the executor API (`runs.executor_api.router`). Status changes go through the kernel
(`runs.kernel`'s leases for claims, renewal and revocation; `task_complete` / `task_fail`
for results).
"""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass
from typing import Any

from django.db.models import Q
from django.utils import timezone

from runs import kernel
from runs.kernel import Conflict, Forbidden, InvalidRequest, KernelError, NotFound, check_storable
from runs.models import Executor, Task
from runs.tools import get_tool
from tenancy.models import Membership, Role, Workspace
from tenancy.tokens import token_digest

# Error keys an executor may report for a failed call; anything else is `tool_failed`.
REPORTABLE_KEYS = ("tool_failed", "tool_timeout")
ERROR_MAX = 2000


@dataclass(frozen=True)
class Registered:
    executor: Executor
    token: str


def register(*, user: Any, tools: Any, name: Any = "", workspace: Any = None) -> Registered:
    """Register an executor serving `tools` (runner tools of the registry) for its owner's workspaces.
    The fields' types are the body's shape (kernel.REGISTER_BODY); which tools exist, the registry's."""
    kernel.read_fields(kernel.REGISTER_BODY, {"tools": tools, "name": name, "workspace": workspace})
    for tool_name in tools:
        tool = get_tool(tool_name)
        if tool is None:
            raise InvalidRequest("unknown_tool", f"no tool named {tool_name!r} is installed")
        if not tool.runner:
            raise InvalidRequest("not_a_runner_tool", f"{tool_name!r} runs in the workers, not on executors")
    operated = Membership.objects.filter(user_id=user.pk, role=Role.OPERATOR)
    scope: Workspace | None = None
    if workspace is not None:
        scope = Workspace.objects.filter(slug=workspace, memberships__user_id=user.pk).first()
        if scope is None:
            raise NotFound("workspace")
        if not operated.filter(workspace=scope).exists():
            raise Forbidden("registering an executor for this workspace needs operator standing in it")
    elif not operated.exists():
        raise Forbidden("registering an executor needs operator standing in some workspace")
    token = secrets.token_urlsafe(32)
    executor = Executor.objects.create(
        name=name,
        owner=user,
        workspace=scope,
        tools=sorted(set(tools)),
        token_digest=token_digest(token),
        last_heartbeat_at=timezone.now(),
    )
    return Registered(executor, token)


def authenticate(token: str) -> Executor | None:
    executor = Executor.objects.filter(token_digest=token_digest(token)).select_related("owner").first()
    if executor is None or executor.revoked or not executor.owner.is_active:
        return None
    return executor


def _require_self(executor: Executor, executor_id: str) -> None:
    if str(executor.pk) != str(executor_id):
        raise Forbidden("an executor acts only for itself")


def _seen(executor: Executor) -> None:
    Executor.objects.filter(pk=executor.pk).update(last_heartbeat_at=timezone.now())


def workspace_ids(executor: Executor) -> list[int]:
    """Where the executor may serve: its one workspace, else every one its owner operates (checked
    on each claim, so losing the role stops the executor at once)."""
    operated = Membership.objects.filter(user_id=executor.owner_id, role=Role.OPERATOR)
    if executor.workspace_id is not None:
        operated = operated.filter(workspace_id=executor.workspace_id)
    return list(operated.values_list("workspace_id", flat=True))


def claim(executor: Executor, executor_id: str) -> kernel.LeasedCall | None:
    _require_self(executor, executor_id)
    _seen(executor)
    return kernel.claim_call(
        executor_id=executor.pk,
        executor_name=executor.name,
        tools=executor.tools,
        workspace_ids=workspace_ids(executor),
        owner_id=executor.owner_id,
    )


def _call_id(call: str) -> int:
    try:
        return int(call)
    except (TypeError, ValueError):
        raise NotFound("call") from None


def heartbeat(executor: Executor, executor_id: str, call: str) -> bool:
    """Renew the lease on a call. Returns whether the executor should stop (a cancel reached it)."""
    _require_self(executor, executor_id)
    _seen(executor)
    held, cancel = kernel.renew_lease(_call_id(call), kernel.claim_prefix(executor.pk))
    if not held:
        raise Conflict("lease_lost", "this executor no longer holds the call (it expired, was canceled or was revoked)")
    return cancel


def report(executor: Executor, executor_id: str, call: str, body: Any) -> None:
    """The call's result: {"ok": true, "value": ...}, {"ok": false, "error": "...", "key"?: ...},
    or {"ok": false, "stopped": true} after a heartbeat asked the executor to stop (kernel.RESULT_BODY)."""
    body = kernel.read_fields(kernel.RESULT_BODY, body)
    _require_self(executor, executor_id)
    _seen(executor)
    task_id = _call_id(call)
    held = kernel.held_call(task_id, kernel.claim_prefix(executor.pk))
    if held is None:
        raise Conflict("lease_lost", "this executor no longer holds the call (it expired, was canceled or was revoked)")
    stop_asked = bool(Task.objects.filter(pk=task_id).values_list("cancel_requested", flat=True).first())
    if not body["ok"] and body.get("stopped") is True and stop_asked:
        # The executor stopped the call because a cancel reached it (its heartbeat said so).
        accepted = kernel.task_stopped(held)
    elif body["ok"]:
        value = body.get("value")
        try:
            check_storable(value)
        except KernelError as error:
            accepted = kernel.task_fail(held, "tool_failed", f"the executor's result cannot be stored: {error.detail}")
        else:
            accepted = kernel.task_complete(held, value)
    else:
        said = body.get("error")
        detail = (said if isinstance(said, str) else "the executor reported a failure")[:ERROR_MAX]
        key = body.get("key") if body.get("key") in REPORTABLE_KEYS else "tool_failed"
        accepted = kernel.task_fail(held, str(key), detail)
    if not accepted:
        raise Conflict("lease_lost", "the call changed before the result arrived")


def revoke(*, executor_id: str, user: Any = None, executor: Executor | None = None) -> tuple[Executor, int]:
    """Revoke an executor (its owner, or the executor itself): its claims end, and unclaimed calls
    addressed to it fail with executor_revoked."""
    target = Executor.objects.filter(pk=executor_id).first() if _is_uuid(executor_id) else None
    if target is None:
        raise NotFound("executor")
    if executor is not None:
        _require_self(executor, executor_id)
    elif user is None or (target.owner_id != user.pk and not user.is_superuser):
        raise NotFound("executor")
    if target.revoked:
        raise Conflict("executor_revoked", "the executor is already revoked")
    Executor.objects.filter(pk=target.pk, revoked=False).update(revoked=True, revoked_at=timezone.now())
    target.revoked = True
    scope = workspace_ids(target)
    # Tools nobody else serves any more in those workspaces: their unclaimed calls were addressed to this one.
    # The owner's private runs count only the owner's own executors (nobody else's may claim them).
    others = (
        Executor.objects.filter(revoked=False).exclude(pk=target.pk).filter(Q(workspace__isnull=True) | Q(workspace_id__in=scope))
    )
    served = {tool for tools in others.values_list("tools", flat=True) for tool in tools}
    served_for_owner = {
        tool for tools in others.filter(owner_id=target.owner_id).values_list("tools", flat=True) for tool in tools
    }
    failed = kernel.revoke_calls(
        executor_id=target.pk,
        orphaned_tools=[tool for tool in target.tools if tool not in served],
        workspace_ids=scope,
        owner_id=target.owner_id,
        private_orphaned_tools=[tool for tool in target.tools if tool not in served_for_owner],
    )
    return target, failed


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True
