"""Who may see and do what in a workspace (API.md "Workspaces and roles").

viewer: statuses, kinds, flags, counts. reader: + content. operator: + write standing.
Non-members see nothing. Whether a reader sees one run's words is the runs app's rule
(`runs.permissions.can_read_content`, built on `role_of`).
"""

from __future__ import annotations

from typing import Any

from tenancy.models import Membership, Role, Wall

ROLE_RANK = {Role.VIEWER: 1, Role.READER: 2, Role.OPERATOR: 3}


def role_of(user: Any, workspace_id: int) -> str | None:
    if user is None or not user.is_authenticated:
        return None
    cache = _roles(user)
    if workspace_id not in cache:
        cache[workspace_id] = (
            Membership.objects.filter(user_id=user.pk, workspace_id=workspace_id).values_list("role", flat=True).first()
        )
    return cache[workspace_id]


def remember_role(user: Any, workspace_id: int, role: str | None) -> None:
    """The person's role in the workspace, read by a caller in a statement of its own (the API's
    standing check reads it with the workspace the path names), kept for `role_of`."""
    _roles(user)[workspace_id] = role


def _roles(user: Any) -> dict[int, str | None]:
    """The person's roles read so far, kept on the user object for the request."""
    roles: dict[int, str | None] = user.__dict__.setdefault("_oz0_roles", {})
    return roles


def is_member(user: Any, workspace_id: int) -> bool:
    return role_of(user, workspace_id) is not None


def has_write_standing(user: Any, workspace_id: int) -> bool:
    return role_of(user, workspace_id) == Role.OPERATOR


def walled_agents(user: Any, workspace_id: int) -> frozenset[str]:
    """The agents whose runs' words a wall closes to this person in the workspace (cached on the
    user object for the request, as roles are)."""
    if user is None or not user.is_authenticated:
        return frozenset()
    cache: dict[int, frozenset[str]] = user.__dict__.setdefault("_oz0_walls", {})
    if workspace_id not in cache:
        names = Wall.objects.filter(workspace_id=workspace_id, members=user.pk).values_list("agent_name", flat=True)
        cache[workspace_id] = frozenset(names)
    return cache[workspace_id]
