"""The Approvers and deadlines section of a workspace's Settings page (operators): approver groups
(who decides calls of which tools, two approvers for calls with effects, where their overdue waits
go) and when waiting work reminds its owners and escalates (runs/approver_groups.py decides)."""

from __future__ import annotations

import re
from typing import Any

from django.http import HttpResponse

from console.views import HtmxHttpRequest, settings_section, settings_write
from runs import approver_groups
from runs.kernel import InvalidRequest, KernelError
from tenancy.models import ApproverGroup, Membership, Role, Workspace

FRAGMENT = "console/_approvers.html"
# A form's minutes field: blank (the install's default) or whole minutes.
MINUTES = re.compile(r"\d{1,7}")


def approvers_context(workspace: Workspace, **state: Any) -> dict[str, Any]:
    groups = [approver_groups.document(g) for g in approver_groups.groups_in(workspace)]
    deadlines = approver_groups.deadlines_document(workspace)
    return {
        "approver_groups": groups,
        # Only operators decide calls: the form offers no one else (the API refuses them, not_an_operator).
        "approver_people": sorted(
            Membership.objects.filter(workspace=workspace, role=Role.OPERATOR).values_list("user__username", flat=True)
        ),
        "deadlines": deadlines
        | {
            "reminder_minutes": _minutes(deadlines["reminder_seconds"]),
            "escalation_minutes": _minutes(deadlines["escalation_seconds"]),
            "default_reminder_minutes": _minutes(deadlines["default_reminder_seconds"]),
            "default_escalation_minutes": _minutes(deadlines["default_escalation_seconds"]),
        },
        "group_error": state.get("group_error"),
        "group_saved": state.get("group_saved"),
        "deadline_error": state.get("deadline_error"),
        "deadline_saved": state.get("deadline_saved", False),
    }


def _minutes(seconds: int | None) -> str:
    return "" if seconds is None else f"{seconds // 60}" if seconds % 60 == 0 else f"{seconds / 60:.2f}"


def _answer(request: HtmxHttpRequest, workspace: Workspace, status: int = 200, **state: Any) -> HttpResponse:
    return settings_section(request, workspace, FRAGMENT, approvers_context(workspace, **state), status)


def group_body(request: HtmxHttpRequest) -> dict[str, Any]:
    """The form as the API's body: tools typed one per line or separated by commas or spaces."""
    tools = [t for t in re.split(r"[\s,]+", str(request.POST.get("tools", ""))) if t]
    return {
        "name": str(request.POST.get("name", "")).strip(),
        "tools": tools,
        "members": request.POST.getlist("members"),
        "two_approvers": request.POST.get("two_approvers") == "1",
        "escalate_to": str(request.POST.get("escalate_to", "")) or None,
    }


@settings_write
def save_group(request: HtmxHttpRequest, workspace: Workspace) -> HttpResponse:
    """Make an approver group, or give the group of that name its new tools, members and options."""
    body = group_body(request)
    try:
        existing = ApproverGroup.objects.filter(workspace=workspace, name=body["name"]).first()
        if existing is None:
            approver_groups.create(workspace=workspace, user=request.user, body=body)
        else:
            approver_groups.replace(workspace=workspace, group_id=existing.pk, body=body)
    except KernelError as refusal:
        return _answer(request, workspace, 400, group_error=refusal.detail or refusal.key)
    return _answer(request, workspace, group_saved=body["name"])


@settings_write
def delete_group(request: HtmxHttpRequest, workspace: Workspace, approver_group_id: int) -> HttpResponse:
    approver_groups.delete(workspace=workspace, group_id=approver_group_id)
    return _answer(request, workspace)


def _seconds(value: str, label: str) -> int | None:
    text = value.strip()
    if not text:
        return None
    if not MINUTES.fullmatch(text):
        raise InvalidRequest("invalid_deadlines", f"{label} is blank (the install's default), 0 (off) or whole minutes")
    return int(text) * 60


@settings_write
def save_deadlines(request: HtmxHttpRequest, workspace: Workspace) -> HttpResponse:
    """Set when waits remind their owners and escalate (minutes; blank: the install's default; 0: off)."""
    try:
        body = {
            "reminder_seconds": _seconds(str(request.POST.get("reminder_minutes", "")), "the reminder"),
            "escalation_seconds": _seconds(str(request.POST.get("escalation_minutes", "")), "the escalation"),
            "escalate_to": str(request.POST.get("escalate_to", "")) or None,
        }
        approver_groups.replace_deadlines(workspace=workspace, body=body)
    except KernelError as refusal:
        return _answer(request, workspace, 400, deadline_error=refusal.detail or refusal.key)
    return _answer(request, workspace, deadline_saved=True)
