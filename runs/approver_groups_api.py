"""/api/v1/workspaces/{ws}/approver-groups (list: every member; create, replace, delete: operators)
and /api/v1/workspaces/{ws}/wait-deadlines (read: every member; replace: operators)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router, Status

from runs import approver_groups, selectors
from runs.api import body_of
from runs.schemas import Out, Page
from runs.settings_input import request_body
from runs.workspace_routes import member_read, operator_write
from tenancy.approvers import DEADLINE_MAX_SECONDS, GROUP_MEMBERS_MAX, PATTERN_MAX, PATTERNS_MAX

router = Router(tags=["approvers"])


class ApproverGroupOut(Out):
    id: int
    name: str
    # fnmatch patterns (`*` any run of characters, `?` one): a call whose tool matches one is this
    # group's to decide (a member of any group it matches).
    tools: list[str]
    members: list[str]
    # A matching call that is not replayable runs once two different members approved it.
    two_approvers: bool
    # The group told when a wait it owns is overdue; null: the workspace's operators.
    escalate_to: str | None = None
    created_by: str | None = None
    created_at: str
    updated_at: str


class WaitDeadlinesOut(Out):
    # Seconds before a pending approval, question or hold reminds its owners, and before it is
    # escalated; null: the install's default (shown beside); 0: off.
    reminder_seconds: int | None = None
    escalation_seconds: int | None = None
    # Where the operators' own waits escalate (a group's name); null: the operators, told it is overdue.
    escalate_to: str | None = None
    default_reminder_seconds: int
    default_escalation_seconds: int
    effective_reminder_seconds: int
    effective_escalation_seconds: int


GROUP_NAME = {"type": "string", "pattern": r"^[a-z][a-z0-9_.-]{0,63}$"}
GROUP_BODY = {
    "name": GROUP_NAME,
    "tools": {
        "type": "array",
        "minItems": 1,
        "maxItems": PATTERNS_MAX,
        "items": {"type": "string", "pattern": r"^[A-Za-z0-9_.:/*?-]+$", "maxLength": PATTERN_MAX},
    },
    "members": {
        "type": "array",
        "maxItems": GROUP_MEMBERS_MAX,
        "items": {"type": "string", "minLength": 1, "maxLength": 150},
    },
    "two_approvers": {"type": "boolean", "default": False},
    "escalate_to": {"anyOf": [GROUP_NAME, {"type": "null"}]},
}
SECONDS = {"anyOf": [{"type": "integer", "minimum": 0, "maximum": DEADLINE_MAX_SECONDS}, {"type": "null"}]}
DEADLINES_BODY = {
    "reminder_seconds": SECONDS,
    "escalation_seconds": SECONDS,
    "escalate_to": {"anyOf": [GROUP_NAME, {"type": "null"}]},
}


@member_read(
    router,
    "/workspaces/{ws}/approver-groups",
    Page[ApproverGroupOut],
    summary="The workspace's approver groups: who decides calls of which tools",
)
def list_groups(request: HttpRequest, ws: str) -> dict[str, Any]:
    workspace = selectors.workspace_for(request.user, ws)
    return {"items": [approver_groups.document(g) for g in approver_groups.groups_in(workspace)], "next": None}


@operator_write(
    router,
    "POST",
    "/workspaces/{ws}/approver-groups",
    ApproverGroupOut,
    status=201,
    body=request_body(["name", "tools", "members"], GROUP_BODY),
    summary="Make an approver group (409 group_exists when the name is taken)",
)
def create_group(request: HttpRequest, ws: str) -> Status[dict[str, Any]]:
    workspace = selectors.workspace_for(request.user, ws)
    group = approver_groups.create(workspace=workspace, user=request.user, body=body_of(request))
    return Status(201, approver_groups.document(approver_groups.with_members(group)))


@operator_write(
    router,
    "PUT",
    "/workspaces/{ws}/approver-groups/{approver_group_id}",
    ApproverGroupOut,
    body=request_body(["name", "tools", "members"], GROUP_BODY),
    summary="Replace an approver group's name, tools, members and options",
)
def replace_group(request: HttpRequest, ws: str, approver_group_id: int) -> dict[str, Any]:
    workspace = selectors.workspace_for(request.user, ws)
    group = approver_groups.replace(workspace=workspace, group_id=approver_group_id, body=body_of(request))
    return approver_groups.document(approver_groups.with_members(group))


@operator_write(
    router,
    "DELETE",
    "/workspaces/{ws}/approver-groups/{approver_group_id}",
    None,
    status=204,
    summary="Delete an approver group (its calls go back to the operators)",
)
def delete_group(request: HttpRequest, ws: str, approver_group_id: int) -> Status[None]:
    workspace = selectors.workspace_for(request.user, ws)
    approver_groups.delete(workspace=workspace, group_id=approver_group_id)
    return Status(204, None)


@member_read(
    router, "/workspaces/{ws}/wait-deadlines", WaitDeadlinesOut, summary="When waiting work reminds its owners and escalates"
)
def read_deadlines(request: HttpRequest, ws: str) -> dict[str, Any]:
    return approver_groups.deadlines_document(selectors.workspace_for(request.user, ws))

    # Every field may be left out (null): an empty body puts the install's defaults back.


@operator_write(
    router,
    "PUT",
    "/workspaces/{ws}/wait-deadlines",
    WaitDeadlinesOut,
    body=request_body([], DEADLINES_BODY, optional=True),
    summary="Set the reminder and escalation times (null or left out: the install's default; 0: off)",
)
def replace_deadlines(request: HttpRequest, ws: str) -> dict[str, Any]:
    workspace = selectors.workspace_for(request.user, ws)
    return approver_groups.deadlines_document(approver_groups.replace_deadlines(workspace=workspace, body=body_of(request)))
