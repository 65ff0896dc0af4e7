"""Whose each waiting item is, and whether it is due or overdue (tenancy/approvers.py decides).

An item names its owners (`owners`: the approver groups whose tools it matches, or the operators;
`owner_members`: a group's members), says whether it is the reader's (`yours`), and, when it is
not theirs to decide, turns `actionable` off with the reason (`not_yours`): someone outside the
groups that own a call sees it, and whose it is, but no buttons. A call that needs two approvers
lists the approvals given (`approved_by`); the person who gave the first one waits for a second.

Deadlines: an item past its workspace's reminder time is `due`, past its escalation time
`overdue` (`due_at` and `overdue_at` say when); stages that are off (0) never come.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from runs import kernel
from runs.models import Run, Task, TaskStatus
from tenancy.approvers import OPERATORS, deadlines_of, groups_of, owners_of, patterns_outside, patterns_regex
from tenancy.models import ApproverGroup, Workspace
from tenancy.permissions import has_write_standing


class Groups:
    """Each workspace's approver groups, read once for a page."""

    def __init__(self) -> None:
        self.by_workspace: dict[int, list[ApproverGroup]] = {}

    def of(self, workspace_id: int) -> list[ApproverGroup]:
        if workspace_id not in self.by_workspace:
            self.by_workspace[workspace_id] = groups_of(workspace_id)
        return self.by_workspace[workspace_id]


def deadline_state(workspace: Workspace, since: datetime, now: datetime) -> dict[str, Any]:
    """`due` / `overdue` (or None) and the instants each stage comes, for a wait begun at `since`."""
    reminder, escalation = deadlines_of(workspace)
    due_at = since + timedelta(seconds=reminder) if reminder else None
    overdue_at = since + timedelta(seconds=escalation) if escalation else None
    state = None
    if overdue_at is not None and overdue_at <= now:
        state = "overdue"
    elif due_at is not None and due_at <= now:
        state = "due"
    return {
        "due": state,
        "due_at": due_at.isoformat() if due_at else None,
        "overdue_at": overdue_at.isoformat() if overdue_at else None,
    }


def add_owners(
    user: Any, items: list[dict[str, Any]], tasks: dict[str, Task], runs: dict[str, Run], *, now: datetime | None = None
) -> None:
    """Fill each item (approval, question, hold) with whose it is and its deadlines; a call owned
    by groups the person is not in is not theirs to decide (`actionable` off, `not_yours`)."""
    now = now or timezone.now()
    groups = Groups()
    for item in items:
        if item["kind"] == "client_await":
            continue  # its client answers it, with the token it holds
        task = tasks.get(item["id"])
        run = task.run if task is not None else runs.get(item["id"])
        if run is None:
            continue
        owners = owners_of(groups.of(run.workspace_id), item.get("tool") if item["kind"] == "approval" else None)
        operator = has_write_standing(user, run.workspace_id)
        item["owners"] = [f"group {name}" for name in owners.groups] or [OPERATORS]
        if owners.by_group:
            item["owner_members"] = list(owners.member_names)
        item["yours"] = operator and (not owners.by_group or user.pk in owners.member_ids)
        if owners.by_group and not item["yours"] and item.get("actionable"):
            item["actionable"] = False
            item["not_yours"] = True
        if (
            task is not None
            and item["kind"] == "approval"
            and owners.two_approvers
            and not kernel.call_replayable(task.kind, task.spec)
        ):
            item["two_approvers"] = True
            digest = kernel.spec_digest(task.spec)
            given = [a for a in task.state.get("approvals") or [] if a.get("digest") == digest]
            item["approved_by"] = [str(a.get("by")) for a in given]
            if any(a.get("user") == user.pk for a in given) and item.get("actionable"):
                item["actionable"] = False
                item["awaiting_second"] = True
        since = parse_datetime(item["since"])
        if since is not None:
            item.update(deadline_state(run.workspace, since, now))


def decidable_by_groups(user: Any, workspace_ids: list[int]) -> Q:
    """Pending calls the approver groups let this person decide, as a filter: in each workspace with
    groups, a call whose tool matches a group's pattern only when it matches one of theirs too."""
    rule = Q()
    for workspace_id in workspace_ids:
        every, mine = patterns_outside(groups_of(workspace_id), user.pk)
        theirs = patterns_regex(every)
        if theirs is None:
            continue
        blocked = Q(run__workspace_id=workspace_id, spec__tool__regex=theirs)
        allowed = patterns_regex(mine)
        if allowed is not None:
            blocked &= ~Q(spec__tool__regex=allowed)
        rule &= ~blocked
    return rule


def first_approval_of(run_id: Any, key: str, user: Any) -> bool:
    """Whether this person's approval of a call was the first of two (the call still waits)."""
    task = Task.objects.filter(run_id=run_id, key=key, status=TaskStatus.NEEDS_APPROVAL).only("state").first()
    return task is not None and any(a.get("user") == user.pk for a in task.state.get("approvals") or [])
