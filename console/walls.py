"""The Walls section of a workspace's Settings page (operators): put a wall up around an agent's
runs for named members, change who is behind it, take it down (runs/walls.py decides)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.views.decorators.http import require_POST

from console.views import HtmxHttpRequest, not_found_as_404, settings_refused, settings_section
from oz0agents.models import Agent
from runs import selectors, walls
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


@require_POST
@login_required
@not_found_as_404
def save_wall(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    """Put a wall up, or give an agent's wall its new members."""
    workspace = selectors.workspace_for(request.user, slug)
    if refused := settings_refused(request, workspace):
        return refused
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


@require_POST
@login_required
@not_found_as_404
def delete_wall(request: HtmxHttpRequest, slug: str, wall_id: int) -> HttpResponse:
    workspace = selectors.workspace_for(request.user, slug)
    if refused := settings_refused(request, workspace):
        return refused
    walls.delete(workspace=workspace, wall_id=wall_id)
    return _answer(request, workspace)
