"""A workspace's Settings page, for its operators: its quotas and what it uses of them, how long
its finished runs' trace and findings are kept (retention, editable), its walls (console/walls.py),
its approver groups and wait deadlines (console/approvers.py)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from console.approvers import approvers_context
from console.views import HtmxHttpRequest, fragment_or_page, not_found_as_404, wants_fragment, workspace_context
from console.walls import walls_context
from runs import selectors
from tenancy.models import Workspace
from tenancy.permissions import has_write_standing
from tenancy.retention import RetentionRefused, parse_retention_days, set_retention_days


def _retention(workspace: Workspace, *, error: str | None = None, saved: bool = False) -> dict[str, Any]:
    return {
        "retention_days": workspace.retention_days,
        "retention_default": int(settings.OZ0_RETENTION_DAYS),
        "retention_error": error,
        "retention_saved": saved,
    }


@require_GET
@login_required
@not_found_as_404
def workspace_settings(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    """Operators only: a non-member gets 404 (as every workspace page), a viewer or reader 403."""
    workspace = selectors.workspace_for(request.user, slug)
    context = workspace_context(request, workspace, "settings")
    if not has_write_standing(request.user, workspace.pk):
        return render(request, "console/settings_forbidden.html", context, status=403)
    context |= {
        "quotas": selectors.workspace_quotas(workspace),
        **_retention(workspace),
        **walls_context(workspace),
        **approvers_context(workspace),
    }
    return fragment_or_page(request, "console/settings.html", "console/_quotas.html", context)


@require_POST
@login_required
@not_found_as_404
def workspace_retention(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    """Set the days kept (blank: the install's default). htmx gets the retention fragment back."""
    workspace = selectors.workspace_for(request.user, slug)
    context = workspace_context(request, workspace, "settings")
    if not has_write_standing(request.user, workspace.pk):
        return render(request, "console/settings_forbidden.html", context, status=403)
    try:
        set_retention_days(workspace, parse_retention_days(str(request.POST.get("retention_days", ""))))
    except RetentionRefused as refused:
        context |= {
            "quotas": selectors.workspace_quotas(workspace),
            **_retention(workspace, error=str(refused)),
            **walls_context(workspace),
            **approvers_context(workspace),
        }
        page = "console/_retention.html" if wants_fragment(request) else "console/settings.html"
        return render(request, page, context, status=400)
    if not wants_fragment(request):
        return redirect("workspace_settings", slug=workspace.slug)
    return render(request, "console/_retention.html", context | _retention(workspace, saved=True))
