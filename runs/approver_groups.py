"""Approver groups and wait deadlines: a workspace's operators say who decides which calls, and
when waiting work reminds its owners and escalates (tenancy/approvers.py holds the rules).

Every write checks its whole body before it changes anything: a refusal is typed (400 with a key
per field, `not_an_operator` for a member who may not decide, 409 for a name taken) and leaves the groups as they were. Groups are no secret: every
member may list them (the inbox tells each person whose a call is).
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from runs.kernel import Conflict, InvalidRequest, NotFound
from runs.settings_input import body_fields, workspace_members
from tenancy.approvers import (
    GROUP_MEMBERS_MAX,
    GROUP_NAME,
    GROUPS_MAX,
    OPERATORS,
    PATTERNS_MAX,
    DeadlinesRefused,
    deadlines_of,
    default_escalation_seconds,
    default_reminder_seconds,
    groups_of,
    pattern_problem,
    set_deadlines,
)
from tenancy.models import ApproverGroup, Membership, Role, Workspace

GROUP_FIELDS = {"name", "tools", "members", "two_approvers", "escalate_to"}
DEADLINE_FIELDS = {"reminder_seconds", "escalation_seconds", "escalate_to"}


def document(group: ApproverGroup) -> dict[str, Any]:
    return {
        "id": group.pk,
        "name": group.name,
        "tools": list(group.tools),
        "members": sorted(member.get_username() for member in group.members.all()),
        "two_approvers": group.two_approvers,
        "escalate_to": group.escalate_to.name if group.escalate_to_id and group.escalate_to else None,
        "created_by": group.created_by.get_username() if group.created_by_id and group.created_by else None,
        "created_at": group.created_at.isoformat(),
        "updated_at": group.updated_at.isoformat(),
    }


def groups_in(workspace: Workspace) -> list[ApproverGroup]:
    return groups_of(workspace.pk)


def group_for(workspace: Workspace, group_id: int) -> ApproverGroup:
    group = ApproverGroup.objects.filter(workspace=workspace, pk=group_id).first()
    if group is None:
        raise NotFound("approver group")
    return group


def _name(fields: dict[str, Any]) -> str:
    name = fields.get("name")
    if not isinstance(name, str) or not GROUP_NAME.fullmatch(name) or name == OPERATORS:
        raise InvalidRequest(
            "invalid_name", "`name` is a group's name: lowercase letters, digits and `_.-`, at most 64, not `operators`"
        )
    return name


def _tools(fields: dict[str, Any]) -> list[str]:
    tools = fields.get("tools")
    if not isinstance(tools, list) or not tools or len(tools) > PATTERNS_MAX:
        raise InvalidRequest("invalid_tools", f"`tools` is a list of 1 to {PATTERNS_MAX} tool patterns such as `payments.*`")
    for pattern in tools:
        problem = pattern_problem(pattern)
        if problem:
            raise InvalidRequest("invalid_tool_pattern", problem)
    return list(dict.fromkeys(tools))


def _two_approvers(fields: dict[str, Any]) -> bool:
    value = fields.get("two_approvers", False)
    if not isinstance(value, bool):
        raise InvalidRequest("invalid_field", "`two_approvers` is true or false")
    return value


def _escalation_group(workspace: Workspace, value: Any, *, not_named: str | None = None) -> ApproverGroup | None:
    """The group `escalate_to` names (null: the operators)."""
    if value is None:
        return None
    if not isinstance(value, str) or not GROUP_NAME.fullmatch(value):
        raise InvalidRequest("invalid_escalate_to", "`escalate_to` is an approver group's name, or null for the operators")
    if value == not_named:
        raise InvalidRequest("invalid_escalate_to", "a group cannot escalate to itself")
    group = ApproverGroup.objects.filter(workspace=workspace, name=value).first()
    if group is None:
        raise InvalidRequest("invalid_escalate_to", f"no approver group named {value!r} in this workspace")
    return group


def _deciders(workspace: Workspace, names: Any) -> list[Any]:
    """The group's members: operators of the workspace, as only operators decide calls (a group
    narrows who decides, never widens it); anyone else is `not_an_operator`."""
    members = workspace_members(workspace, names, most=GROUP_MEMBERS_MAX, what="a group")
    operators = set(
        Membership.objects.filter(workspace=workspace, role=Role.OPERATOR, user__in=members).values_list("user_id", flat=True)
    )
    others = [member.get_username() for member in members if member.pk not in operators]
    if others:
        shown = ", ".join(repr(name) for name in others[:5])
        raise InvalidRequest("not_an_operator", f"only operators decide calls; not operators of this workspace: {shown}")
    return members


def _checked(workspace: Workspace, body: Any) -> dict[str, Any]:
    fields = body_fields(body, allowed=GROUP_FIELDS)
    name = _name(fields)
    return {
        "name": name,
        "tools": _tools(fields),
        "members": _deciders(workspace, fields.get("members")),
        "two_approvers": _two_approvers(fields),
        "escalate_to": _escalation_group(workspace, fields.get("escalate_to"), not_named=name),
    }


def create(*, workspace: Workspace, user: Any, body: Any) -> ApproverGroup:
    checked = _checked(workspace, body)
    if ApproverGroup.objects.filter(workspace=workspace).count() >= GROUPS_MAX:
        raise InvalidRequest("too_many_groups", f"a workspace keeps at most {GROUPS_MAX} approver groups")
    try:
        with transaction.atomic():
            group = ApproverGroup.objects.create(
                workspace=workspace,
                name=checked["name"],
                tools=checked["tools"],
                two_approvers=checked["two_approvers"],
                escalate_to=checked["escalate_to"],
                created_by=user,
            )
            group.members.set(checked["members"])
    except IntegrityError:
        raise Conflict("group_exists", f"an approver group named {checked['name']} exists already") from None
    return group


def replace(*, workspace: Workspace, group_id: int, body: Any) -> ApproverGroup:
    """Replace a group's every field (a rename included) with the body's."""
    group = group_for(workspace, group_id)
    checked = _checked(workspace, body)
    if checked["escalate_to"] is not None and checked["escalate_to"].pk == group.pk:
        raise InvalidRequest("invalid_escalate_to", "a group cannot escalate to itself")
    try:
        with transaction.atomic():
            locked = ApproverGroup.objects.select_for_update().filter(pk=group.pk).first()
            if locked is None:
                raise NotFound("approver group")
            for name in ("name", "tools", "two_approvers", "escalate_to"):
                setattr(locked, name, checked[name])
            locked.save()
            locked.members.set(checked["members"])
    except IntegrityError:
        raise Conflict("group_exists", f"an approver group named {checked['name']} exists already") from None
    return locked


def delete(*, workspace: Workspace, group_id: int) -> None:
    group_for(workspace, group_id).delete()


def with_members(group: ApproverGroup) -> ApproverGroup:
    """The group read again with what its document shows (members, escalation, creator)."""
    return ApproverGroup.objects.filter(pk=group.pk).select_related("escalate_to", "created_by").prefetch_related("members").get()


# ---- deadlines ----


def deadlines_document(workspace: Workspace) -> dict[str, Any]:
    reminder, escalation = deadlines_of(workspace)
    escalate_to = (
        ApproverGroup.objects.filter(pk=workspace.escalate_to_id).values_list("name", flat=True).first()
        if workspace.escalate_to_id is not None
        else None
    )
    return {
        "reminder_seconds": workspace.reminder_seconds,
        "escalation_seconds": workspace.escalation_seconds,
        "escalate_to": escalate_to,
        "default_reminder_seconds": default_reminder_seconds(),
        "default_escalation_seconds": default_escalation_seconds(),
        "effective_reminder_seconds": reminder,
        "effective_escalation_seconds": escalation,
    }


def replace_deadlines(*, workspace: Workspace, body: Any) -> Workspace:
    """Set the workspace's reminder and escalation times (null: the install's default; 0: off) and
    the group its operators' waits escalate to (null: the operators)."""
    fields = body_fields(body, allowed=DEADLINE_FIELDS)
    escalate_to = _escalation_group(workspace, fields.get("escalate_to"))
    try:
        set_deadlines(
            workspace,
            reminder=fields.get("reminder_seconds"),
            escalation=fields.get("escalation_seconds"),
            escalate_to=escalate_to,
        )
    except DeadlinesRefused as refused:
        raise InvalidRequest("invalid_deadlines", str(refused)) from None
    return workspace
