"""Whether a person sees a run's words: the one redaction rule (F11, F12).

A private run shows its content to its creator alone; otherwise readers and operators of its
workspace see it. Roles themselves are tenancy's (`tenancy.permissions`).
"""

from __future__ import annotations

from typing import Any

from runs.models import Run
from tenancy.models import Role
from tenancy.permissions import role_of


def can_read_content(user: Any, run: Run) -> bool:
    """The one rule for whether a reader sees a run's words (F11, F12)."""
    role = role_of(user, run.workspace_id)
    if role not in (Role.READER, Role.OPERATOR):
        return False
    return not run.private or run.created_by_id == user.pk
