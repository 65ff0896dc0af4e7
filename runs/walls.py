"""Walls (F11): a workspace's operators close one agent's runs' words to named members.

Behind a wall a member keeps their role's standing (an operator still sees the inbox, the kinds
and the buttons a viewer would) but reads the run's words nowhere: `runs.permissions` decides
for every surface (API, console, inbox, trace, search, exports, notifications), so a wall is one
row here and one check there. Walls themselves are no secret: every member may list them.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from oz0agents.lint import NAME_MAX, NAME_PATTERN
from runs.kernel import Conflict, InvalidRequest, NotFound
from runs.settings_input import body_fields, workspace_members
from tenancy.models import Wall, Workspace

MEMBERS_MAX = 500
WALLS_MAX = 200


def document(wall: Wall) -> dict[str, Any]:
    return {
        "id": wall.pk,
        "agent": wall.agent_name,
        "members": sorted(member.username for member in wall.members.all()),
        "created_by": wall.created_by.get_username() if wall.created_by else None,
        "created_at": wall.created_at.isoformat(),
        "updated_at": wall.updated_at.isoformat(),
    }


def walls_of(workspace: Workspace) -> list[Wall]:
    # Members prefetched: one query for every wall's members, not one per wall.
    return list(
        Wall.objects.filter(workspace=workspace).select_related("created_by").prefetch_related("members").order_by("agent_name")
    )


def wall_for(workspace: Workspace, wall_id: int) -> Wall:
    wall = Wall.objects.filter(workspace=workspace, pk=wall_id).select_related("created_by").first()
    if wall is None:
        raise NotFound("wall")
    return wall


def _agent(body: dict[str, Any]) -> str:
    agent = body.get("agent")
    if not isinstance(agent, str) or not NAME_PATTERN.match(agent) or len(agent) > NAME_MAX:
        raise InvalidRequest("invalid_agent", f"`agent` must be an agent's name (lowercase, digits, `_.-`, at most {NAME_MAX})")
    return agent


def _members(workspace: Workspace, body: dict[str, Any]) -> list[Any]:
    return workspace_members(workspace, body.get("members"), most=MEMBERS_MAX, what="a wall")


def create(*, workspace: Workspace, user: Any, body: Any) -> Wall:
    fields = body_fields(body, allowed={"agent", "members"})
    agent, members = _agent(fields), _members(workspace, fields)
    if Wall.objects.filter(workspace=workspace).count() >= WALLS_MAX:
        raise InvalidRequest("too_many_walls", f"a workspace keeps at most {WALLS_MAX} walls")
    try:
        with transaction.atomic():
            wall = Wall.objects.create(workspace=workspace, agent_name=agent, created_by=user)
            wall.members.set(members)
    except IntegrityError:
        raise Conflict("wall_exists", f"a wall around {agent} exists already: change its members instead") from None
    return wall


def replace_members(*, workspace: Workspace, wall_id: int, body: Any) -> Wall:
    fields = body_fields(body, allowed={"members"})
    with transaction.atomic():
        wall = wall_for(workspace, wall_id)
        wall.members.set(_members(workspace, fields))
        wall.save(update_fields=["updated_at"])
    return wall


def delete(*, workspace: Workspace, wall_id: int) -> None:
    wall_for(workspace, wall_id).delete()
