"""Whether a person sees a run's words: the one redaction rule (F11, F12).

A private run shows its content to its creator alone; otherwise readers and operators of its
workspace see it, unless a wall around the run's agent names them (`tenancy.models.Wall`). Roles
and walls themselves are tenancy's (`tenancy.permissions`).
"""

from __future__ import annotations

from typing import Any

from django.db.models import Exists, OuterRef, Q

from runs.models import Run
from tenancy.models import Membership, Role, Wall
from tenancy.permissions import role_of, walled_agents

CONTENT_ROLES = (Role.READER, Role.OPERATOR)


def can_read_content(user: Any, run: Run) -> bool:
    """The one rule for whether a reader sees a run's words (F11, F12)."""
    role = role_of(user, run.workspace_id)
    if role not in CONTENT_ROLES:
        return False
    if run.private and run.created_by_id != user.pk:
        return False
    return not behind_a_wall(user, run)


def behind_a_wall(user: Any, run: Run) -> bool:
    """Whether a wall around the run's agent closes its words to this person (their own runs too)."""
    return bool(run.agent_name) and run.agent_name in walled_agents(user, run.workspace_id)


def walled_off(user: Any, run_prefix: str = "") -> Q:
    """Runs (or rows whose run is at `run_prefix`, e.g. "run__") behind a wall for this person."""
    walls = Wall.objects.filter(
        workspace_id=OuterRef(f"{run_prefix}workspace_id"), agent_name=OuterRef(f"{run_prefix}agent_name"), members=user.pk
    )
    return Q(Exists(walls))


def content_readable(user: Any) -> Q:
    """`can_read_content` as a filter on runs, for a search over words that must match only the
    runs the searcher may read (tests/runs/test_content_rule.py holds the two to one answer)."""
    if user is None or not user.is_authenticated:
        return Q(pk__in=[])
    member_of = Membership.objects.filter(user_id=user.pk, role__in=CONTENT_ROLES).values("workspace_id")
    return Q(workspace_id__in=member_of) & (Q(private=False) | Q(created_by_id=user.pk)) & ~walled_off(user)
