"""A workspace's Settings page: its quotas and what it uses of them, for its operators."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from console.views import HtmxHttpRequest, fragment_or_page, not_found_as_404, workspace_context
from runs import selectors
from tenancy.permissions import has_write_standing


@require_GET
@login_required
@not_found_as_404
def workspace_settings(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    """Operators only: a non-member gets 404 (as every workspace page), a viewer or reader 403."""
    workspace = selectors.workspace_for(request.user, slug)
    context = workspace_context(request, workspace, "settings")
    if not has_write_standing(request.user, workspace.pk):
        return render(request, "console/settings_forbidden.html", context, status=403)
    context |= {"quotas": selectors.workspace_quotas(workspace)}
    return fragment_or_page(request, "console/settings.html", "console/_quotas.html", context)
