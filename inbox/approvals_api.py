"""Approve many identical calls in the JSON API (issue 30, item 1):
`POST /api/v1/workspaces/{ws}/approvals/approve-many`.

The body names a call by its tool and digest (the inbox item's); `preview: true` lists the pending
calls with that digest this person may approve (`inbox.approvals.calls_with_digest`, the console's
selection), otherwise each is approved through `kernel.approve` under its own run's lock and bound
to the digest (`inbox.approvals.approve_calls`, the console's step): what was decided, and what was
skipped with the kernel's reason (decided or changed meanwhile, effects unconfirmed, not yours).
"""

from __future__ import annotations

import uuid
from typing import Any

from django.http import HttpRequest
from ninja import Router, Schema

from inbox import approvals
from oz0site.auth import person_auth
from runs import kernel, selectors
from runs.api import ERRORS, fields_of, shaped_body
from runs.kernel import BodyShape, InvalidRequest

router = Router(tags=["inbox"])

_CALL = {
    "type": "object",
    "required": ["run", "task"],
    "additionalProperties": False,
    "properties": {
        "run": {"type": "string", "format": "uuid"},
        "task": {"type": "string", "minLength": 1, "maxLength": 200},
    },
}
APPROVE_MANY_BODY = BodyShape(
    "ApproveManyIn",
    {
        "tool": {"type": "string", "minLength": 1, "maxLength": 200},
        "digest": {"type": "string", "pattern": kernel.DIGEST_PATTERN},
        "preview": {"type": "boolean", "default": False},
        # A call that is not replayable has effects: approving many of them needs this said.
        "confirm_effects": {"type": "boolean", "default": False},
        # The calls a preview listed that the person keeps (unticked rows left out); null: every one.
        "calls": {
            "anyOf": [{"type": "array", "minItems": 1, "maxItems": approvals.APPROVE_MANY_MAX, "items": _CALL}, {"type": "null"}]
        },
    },
    required=("tool", "digest"),
    description="The pending calls of `tool` whose arguments' digest is `digest`, across the workspace's runs: "
    "`preview` lists them (`would_decide`); otherwise each is approved bound to that digest (`decided`), or "
    "`skipped` with the reason. A call that is not replayable is approved only with `confirm_effects`.",
)


class ApprovalCall(Schema):
    run: str
    task: str
    agent: str | None = None
    agent_version: int | None = None
    deadline: str | None = None


class ApprovalSkipped(Schema):
    """A call not approved: the kernel's refusal key (`not_pending`: decided meanwhile;
    `approval_stale`: changed, or not this call; `effects_unconfirmed`; `content_hidden`;
    `not_an_approver`: an approver group owns it; `same_approver`: you gave its first approval;
    `not_found`), or `first_approval` (recorded: the call waits for a second approver), and its words."""

    run: str
    task: str
    reason: str
    detail: str | None = None


class ApproveManyOut(Schema):
    tool: str
    digest: str
    preview: bool
    # Whether the calls may run again blind (false: they have effects); null when none matched.
    replayable: bool | None = None
    cap: int
    # More calls match than one step decides (`cap`): ask again after this one.
    more: bool
    # The oldest pending calls of the tool were looked through, not every one: ask again.
    scan_capped: bool
    count: int
    would_decide: list[ApprovalCall] | None = None
    decided: list[ApprovalCall] | None = None
    skipped: list[ApprovalSkipped]


@router.post(
    "/workspaces/{ws}/approvals/approve-many",
    auth=person_auth("operator", where="ws", rate="write"),
    response={200: ApproveManyOut, **ERRORS},
    summary="Approve identical pending calls across runs, after a preview (S5, S6)",
    openapi_extra=shaped_body(APPROVE_MANY_BODY),
)
def approve_many(request: HttpRequest, ws: str) -> dict[str, Any]:
    workspace = selectors.workspace_for(request.user, ws)
    kernel.require_write(request.user, workspace.pk)
    body = fields_of(request, APPROVE_MANY_BODY)
    tool, digest = body["tool"], body["digest"]
    chosen = _chosen(body.get("calls"))
    found = approvals.calls_with_digest(request.user, workspace, tool, digest)
    listed = found["calls"]
    skipped: list[dict[str, Any]] = []
    if chosen is not None:
        matching = {(c["run"], c["task"]) for c in listed}
        listed = [c for c in listed if (c["run"], c["task"]) in chosen]
        if body.get("preview"):
            skipped = [
                {
                    "run": run,
                    "task": key,
                    "reason": "not_matching",
                    "detail": "not a pending call with this digest you may approve",
                }
                for run, key in chosen
                if (run, key) not in matching
            ]
    answer = {k: found[k] for k in ("tool", "digest", "replayable", "more", "scan_capped")} | {"cap": approvals.APPROVE_MANY_MAX}
    if body.get("preview"):
        return answer | {"preview": True, "would_decide": listed, "skipped": skipped, "count": len(listed)}
    # Decide what the person named, else every matching call; the kernel re-checks each under its lock.
    calls = list(chosen) if chosen is not None else [(c["run"], c["task"]) for c in listed]
    rows = {(c["run"], c["task"]): c for c in found["calls"]}
    outcomes = (
        approvals.approve_calls(request.user, workspace, calls, digest=digest, confirm_effects=bool(body.get("confirm_effects")))
        if calls
        else []
    )
    decided = [
        rows.get((o["run"], o["task"]), {"run": o["run"], "task": o["task"]}) for o in outcomes if o["outcome"] == "approved"
    ]
    skipped = [
        {"run": o["run"], "task": o["task"], "reason": o["outcome"], "detail": o.get("detail")}
        for o in outcomes
        if o["outcome"] != "approved"
    ]
    return answer | {"preview": False, "decided": decided, "skipped": skipped, "count": len(decided)}


def _chosen(calls: Any) -> list[tuple[str, str]] | None:
    """The calls the body names, as (run, task) pairs in order, each checked (typed 400s)."""
    if calls is None:
        return None
    pairs = []
    for index, call in enumerate(calls):
        run, key = call.get("run"), call.get("task")
        if set(call) - {"run", "task"} or not isinstance(run, str) or not isinstance(key, str):
            raise InvalidRequest("invalid_field", f'`calls[{index}]` must be {{"run": <run id>, "task": <task key>}}')
        if not approvals.is_call_ref(run, key):
            raise InvalidRequest("invalid_field", f"`calls[{index}]` names no call: a run id and a task key (1-200 characters)")
        pairs.append((str(uuid.UUID(run)), key))
    return list(dict.fromkeys(pairs))
