"""Canary rollouts on the Agents page (issue 33 item 4): every agent with a canary under way, its
two arms side by side (runs, failure rate with its interval, kinds), the rollout trail, and for
operators a Promote and a Roll back button. One fragment (`insights/_rollouts.html`) serves the
page's section and every htmx answer."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from django.shortcuts import redirect, render

from console.views import HtmxHttpRequest, console_post, refused_verb, wants_fragment
from insights import canary
from oz0agents import rollouts
from oz0agents.models import Agent
from runs import kernel, selectors
from tenancy.models import Workspace
from tenancy.permissions import has_write_standing

TRAIL = 10


def rollouts_context(user: Any, workspace: Workspace) -> dict[str, Any]:
    agents = Agent.objects.filter(workspace=workspace, canary_version__isnull=False).select_related(
        "stable_version", "canary_version"
    )
    return {
        "rollouts": [canary.document(agent) for agent in agents.order_by("name")],
        "rollout_events": [rollouts.event_document(e) for e in rollouts.events(workspace, limit=TRAIL)],
        "can_roll": has_write_standing(user, workspace.pk),
    }


def _plain(*, status: int, error: str) -> HttpResponse:
    # The section has no place for an error: without JavaScript the refusal is the answer itself.
    return HttpResponse(error, status=status, content_type="text/plain")


def _verb(request: HtmxHttpRequest, slug: str, name: str, verb: str) -> HttpResponse:
    workspace = selectors.workspace_for(request.user, slug)
    if not has_write_standing(request.user, workspace.pk):
        return refused_verb(request, kernel.Forbidden("Promoting or rolling back a canary needs the operator role."), _plain)
    act = rollouts.promote if verb == "promote" else rollouts.rollback
    try:
        act(workspace=workspace, user=request.user, name=name)
    except kernel.KernelError as error:
        return refused_verb(request, error, _plain)
    if not wants_fragment(request):
        return redirect("agents", slug=workspace.slug)
    context = {"workspace": workspace, **rollouts_context(request.user, workspace)}
    return render(request, "insights/_rollouts.html", context)


@console_post
def promote(request: HtmxHttpRequest, slug: str, name: str) -> HttpResponse:
    return _verb(request, slug, name, "promote")


@console_post
def rollback(request: HtmxHttpRequest, slug: str, name: str) -> HttpResponse:
    return _verb(request, slug, name, "rollback")
