"""Who acts, and whether they may write: the standing every kernel entry point checks first."""

from __future__ import annotations

from typing import Any

from runs.kernel.errors import ContentHidden, Forbidden, NotAnApprover, NotFound
from runs.models import Run, Task
from runs.permissions import can_read_content
from tenancy.approvers import OPERATORS_OWN, Owners, call_owners, may_decide
from tenancy.permissions import has_write_standing, is_member


def actor_name(user: Any) -> str:
    if user is None:
        return "kernel"
    return getattr(user, "username", str(user))


def require_write(user: Any, workspace_id: int) -> None:
    if user is None:
        return  # the kernel's own callers (sweeps, the demo loader) act for the platform
    if not is_member(user, workspace_id):
        raise NotFound("workspace")
    if not has_write_standing(user, workspace_id):
        raise Forbidden()


def require_content(user: Any, run: Run) -> None:
    """Approving, denying or answering decides on the run's words: whoever decides must be able to
    read them (F11); someone else's private run is not decided blind."""
    if user is None:
        return
    if not can_read_content(user, run):
        raise ContentHidden()


def require_approver(user: Any, run: Run, task: Task) -> Owners:
    """Whose the call is (tenancy/approvers.py), refusing a person outside the groups that own it
    (`not_an_approver`). The kernel's own callers decide for the platform."""
    owners = call_owners(run.workspace_id, task.spec.get("tool")) if task.kind == "tool" else OPERATORS_OWN
    if user is not None and not may_decide(owners, user):
        raise NotAnApprover(owners.groups)
    return owners
