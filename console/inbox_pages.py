"""The inbox page: everything in a workspace that waits on a person."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_GET

from console.approvals import decided_meanwhile
from console.views import (
    HtmxHttpRequest,
    fingerprint,
    live_fragment,
    live_state,
    not_found_as_404,
    wants_fragment,
    workspace_context,
)
from inbox import selectors
from runs import kernel
from runs import selectors as run_selectors
from tenancy.models import Workspace

PAGE = 25
# How deep a live refresh keeps a person who clicked "Load more": the items on screen, up to this.
SHOWN_MAX = 200


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
    shown = shown_count(request.GET.get("shown"))
    context = workspace_context(request, workspace, "inbox") | {
        "kind": kind or "",
        "agent": agent or "",
        "kinds": selectors.KINDS,
    }
    if cursor:
        try:
            page = selectors.inbox_items(
                request.user, workspace=workspace.slug, kind=kind, agent=agent, cursor=cursor, limit=PAGE
            )
        except kernel.KernelError:  # a cursor this server did not give: start over
            cursor = None
        else:
            return more_items(request, workspace, context, page, shown)
    # The first page (or, for a live refresh, as many items as the person has loaded) carries
    # the kind tabs with their counts and the agent filter.
    limit = max(PAGE, shown)
    page = selectors.inbox_items(request.user, workspace=workspace.slug, kind=kind, agent=agent, limit=limit)
    context |= {
        "page": page,
        "more": False,
        "shown": len(page["items"]),
        "agents": selectors.inbox_agents(workspace),
        "counts": selectors.inbox_counts(workspace, agent),
        # What the person was typing into and is gone now: who decided it meanwhile.
        "meanwhile": [
            {"run": run_id, "task": key, "detail": decided_meanwhile(run_id, key)}
            for run_id, key in selectors.drafts_gone(workspace, request.GET.getlist("draft"), page["items"])
        ],
    }
    return live_fragment(request, "inbox/inbox.html", "inbox/_items.html", context, state={"shown": context["shown"]})


def more_items(
    request: HtmxHttpRequest, workspace: Workspace, context: dict[str, Any], page: dict[str, Any], shown: int
) -> HttpResponse:
    """ "Load more" appends the next items, and tells the live container how many are on screen
    now (out of band), so its next refresh keeps them instead of falling back to the first page."""
    through = min(shown + len(page["items"]), SHOWN_MAX)
    items = render_to_string("inbox/_items.html", context | {"page": page, "more": True, "shown": through}, request=request)
    if not wants_fragment(request):  # without JavaScript: the next items as a page of their own
        return render(request, "inbox/inbox.html", context | {"fragment": items})
    # The fingerprint of what a refresh at this depth would show, so an unchanged inbox still answers 204.
    whole = selectors.inbox_items(
        request.user,
        workspace=workspace.slug,
        kind=context["kind"] or None,
        agent=context["agent"] or None,
        limit=max(PAGE, through),
    )
    refreshed = render_to_string(
        "inbox/_items.html",
        context
        | {
            "page": whole,
            "more": False,
            "shown": len(whole["items"]),
            "agents": selectors.inbox_agents(workspace),
            "counts": selectors.inbox_counts(workspace, context["agent"] or None),
        },
        request=request,
    )
    state = live_state(fingerprint(refreshed), {"shown": len(whole["items"])}, oob="#inbox-items > .live-state")
    response = HttpResponse(items + state)
    patch_vary_headers(response, ("HX-Request",))
    return response


def shown_count(value: str | None) -> int:
    """How many items the browser shows (a live refresh's `shown`); anything odd is the first page."""
    try:
        return max(0, min(int(value or 0), SHOWN_MAX))
    except (TypeError, ValueError):
        return 0
