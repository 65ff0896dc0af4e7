"""/api/v1/workspaces/{ws}/walls: list (every member), create, change members, delete (operators)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router, Status

from runs import selectors, walls
from runs.api import body_of
from runs.schemas import Out, Page
from runs.settings_input import request_body
from runs.workspace_routes import member_read, operator_write

router = Router(tags=["walls"])


class WallOut(Out):
    id: int
    agent: str
    # Usernames of the members behind the wall: they read none of the agent's runs' words (F11).
    members: list[str]
    created_by: str | None = None
    created_at: str
    updated_at: str


AGENT = {"type": "string", "pattern": r"^[a-z][a-z0-9_.-]*$", "maxLength": 100}
MEMBERS = {"type": "array", "maxItems": walls.MEMBERS_MAX, "items": {"type": "string", "minLength": 1, "maxLength": 150}}


@member_read(
    router,
    "/workspaces/{ws}/walls",
    Page[WallOut],
    summary="The workspace's walls: whose members read none of an agent's runs' words",
)
def list_walls(request: HttpRequest, ws: str) -> dict[str, Any]:
    workspace = selectors.workspace_for(request.user, ws)
    return {"items": [walls.document(w) for w in walls.walls_of(workspace)], "next": None}


@operator_write(
    router,
    "POST",
    "/workspaces/{ws}/walls",
    WallOut,
    status=201,
    body=request_body(["agent", "members"], {"agent": AGENT, "members": MEMBERS}),
    summary="Wall members off from an agent's runs' words (409 wall_exists when the agent has one)",
)
def create_wall(request: HttpRequest, ws: str) -> Status[dict[str, Any]]:
    workspace = selectors.workspace_for(request.user, ws)
    return Status(201, walls.document(walls.create(workspace=workspace, user=request.user, body=body_of(request))))


@operator_write(
    router,
    "PUT",
    "/workspaces/{ws}/walls/{wall_id}",
    WallOut,
    body=request_body(["members"], {"members": MEMBERS}),
    summary="Replace the members behind a wall",
)
def change_wall(request: HttpRequest, ws: str, wall_id: int) -> dict[str, Any]:
    workspace = selectors.workspace_for(request.user, ws)
    return walls.document(walls.replace_members(workspace=workspace, wall_id=wall_id, body=body_of(request)))


@operator_write(router, "DELETE", "/workspaces/{ws}/walls/{wall_id}", None, status=204, summary="Take a wall down")
def delete_wall(request: HttpRequest, ws: str, wall_id: int) -> Status[None]:
    workspace = selectors.workspace_for(request.user, ws)
    walls.delete(workspace=workspace, wall_id=wall_id)
    return Status(204, None)
