"""The inbox page: everything in a workspace that waits on a person."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.views.decorators.http import require_GET

from inbox import selectors
from runs import selectors as run_selectors
from runs.kernel.errors import KernelError
from runs.views import HtmxHttpRequest, fragment_or_page, not_found_as_404, workspace_context


@require_GET
@login_required
@not_found_as_404
def inbox(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    workspace = run_selectors.workspace_for(request.user, slug)
    kind = request.GET.get("kind") or None
    if kind not in selectors.KINDS:
        kind = None
    agent = request.GET.get("agent") or None
    cursor = request.GET.get("cursor") or None
    try:
        page = selectors.inbox_items(request.user, workspace=workspace.slug, kind=kind, agent=agent, cursor=cursor, limit=25)
    except KernelError:  # a cursor this server did not give: start over
        page = selectors.inbox_items(request.user, workspace=workspace.slug, kind=kind, agent=agent, limit=25)
        cursor = None
    context = workspace_context(request, workspace, "inbox") | {
        "page": page,
        "kind": kind or "",
        "agent": agent or "",
        "kinds": selectors.KINDS,
        "more": bool(cursor),
    }
    if not cursor:  # the first page carries the kind tabs with their counts and the agent filter
        context |= {"agents": selectors.inbox_agents(workspace), "counts": selectors.inbox_counts(workspace)}
    return fragment_or_page(request, "inbox/inbox.html", "inbox/_items.html", context)
