"""The Walls section of a workspace's Settings page (operators): put a wall up around an agent's
runs for named members, change who is behind it, take it down (runs/walls.py decides)."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse

from console.views import HtmxHttpRequest, settings_section, settings_write
from oz0agents.models import Agent
from runs import walls
from runs.kernel import KernelError
from tenancy.models import Membership, Wall, Workspace


def walls_context(workspace: Workspace, *, error: str | None = None, saved: str | None = None) -> dict[str, Any]:
    return {
        "walls": [walls.document(w) for w in walls.walls_of(workspace)],
        "wall_agents": sorted(Agent.objects.filter(workspace=workspace).values_list("name", flat=True)),
        "wall_people": sorted(Membership.objects.filter(workspace=workspace).values_list("user__username", flat=True)),
        "wall_error": error,
        "wall_saved": saved,
    }


def _answer(request: HtmxHttpRequest, workspace: Workspace, status: int = 200, **state: Any) -> HttpResponse:
    return settings_section(request, workspace, "console/_walls.html", walls_context(workspace, **state), status)


@settings_write
def save_wall(request: HtmxHttpRequest, workspace: Workspace) -> HttpResponse:
    """Put a wall up, or give an agent's wall its new members."""
    agent = str(request.POST.get("agent", ""))
    body = {"agent": agent, "members": request.POST.getlist("members")}
    try:
        existing = Wall.objects.filter(workspace=workspace, agent_name=agent).first()
        if existing is None:
            walls.create(workspace=workspace, user=request.user, body=body)
        else:
            walls.replace_members(workspace=workspace, wall_id=existing.pk, body={"members": body["members"]})
    except KernelError as refusal:
        return _answer(request, workspace, 400, error=refusal.detail or refusal.key)
    return _answer(request, workspace, saved=agent)


@settings_write
def delete_wall(request: HtmxHttpRequest, workspace: Workspace, wall_id: int) -> HttpResponse:
    walls.delete(workspace=workspace, wall_id=wall_id)
    return _answer(request, workspace)
