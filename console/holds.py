"""The holds page: runs stopped for a person, with what a repairer needs (runs/holds.py selects
them). The repairs themselves are verbs in console/verbs.py; many at once in
console/bulk_repair.py."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.views.decorators.http import require_GET

from console.views import HtmxHttpRequest, live_fragment, not_found_as_404, workspace_context
from runs import failures, selectors
from runs.holds import BULK_CAP, held_agents, held_runs


@require_GET
@login_required
@not_found_as_404
def holds(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    workspace = selectors.workspace_for(request.user, slug)
    context = workspace_context(request, workspace, "holds") | {
        "holds": held_runs(request.user, workspace),
        "held_agents": held_agents(workspace),
        "failure_kinds": sorted(failures.PLATFORM_KINDS),
        "bulk_cap": BULK_CAP,
    }
    return live_fragment(request, "console/holds.html", "console/_holds.html", context)
