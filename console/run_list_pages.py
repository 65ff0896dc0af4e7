"""The runs list: search by run id (whole or its first digits), agent, creator and status, a
duration and badges (calls denied, decided by a person) per row, keyset pages whose signed cursor
pages its own filter only, and saved filters (a person's own, per workspace).

Queries live in runs/run_list.py and console/saved_filters.py; a bad query value or cursor is a
typed 400 (`invalid_<field>`), never a 500. Saved filters are a person's view of the list, not an
act on runs: every member may keep their own; nobody sees or deletes another's (404).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from console import saved_filters
from console.views import HtmxHttpRequest, fragment_or_page, live_fragment, not_found_as_404, wants_fragment, workspace_context
from runs import kernel, selectors
from runs.run_list import STATUSES, RunFilter, list_rows, parse_run_filter, suggestions
from tenancy.models import Workspace

FILTER_FIELDS = ("status", "agent", "creator", "run")


@require_GET
@login_required
@not_found_as_404
def runs_list(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    workspace = selectors.workspace_for(request.user, slug)
    cursor = request.GET.get("cursor")
    try:
        run_filter = parse_run_filter(request.GET)
        page = list_rows(request.user, workspace, run_filter, cursor=cursor)
    except kernel.InvalidRequest as error:
        return refused(request, workspace, error)
    context = list_context(request, workspace, run_filter) | {"page": page, "more": bool(cursor)}
    if cursor and wants_fragment(request):  # "Load more" appends rows
        return fragment_or_page(request, "runs/runs.html", "runs/_run_rows.html", context)
    # The live refresh replaces the table with its count.
    return live_fragment(request, "runs/runs.html", "runs/_runs_table.html", context)


def list_context(request: HtmxHttpRequest, workspace: Workspace, run_filter: RunFilter) -> dict[str, Any]:
    query = run_filter.as_query()
    return workspace_context(request, workspace, "runs") | {
        "filter": query,
        "typed": {name: query.get(name, "") for name in FILTER_FIELDS},
        "status": query.get("status", ""),
        "query": urlencode(query),
        "others": urlencode({name: value for name, value in query.items() if name != "status"}),
        "statuses": STATUSES,
        "saved": saved_filters.saved_filters(request.user, workspace),
        "suggest": suggestions(workspace),
    }


def refused(request: HtmxHttpRequest, workspace: Workspace, error: kernel.InvalidRequest) -> HttpResponse:
    """A bad filter or cursor: the page with the reason (and the filter cleared), a 400."""
    context = list_context(request, workspace, RunFilter()) | {
        "page": {"count": 0, "items": [], "next": None},
        "error": error.detail,
        "error_key": error.key,
        "typed": {name: str(request.GET.get(name, ""))[:200] for name in FILTER_FIELDS},
    }
    template = "runs/_runs_table.html" if wants_fragment(request) else "runs/runs.html"
    if template == "runs/runs.html":
        context["fragment"] = render(request, "runs/_runs_table.html", context).content.decode()
    return render(request, template, context, status=error.status)


@require_POST
@login_required
@not_found_as_404
def save_filter(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    """Save the list's current filter (the form's fields) under a name: the saved list answers."""
    workspace = selectors.workspace_for(request.user, slug)
    query = {name: request.POST.get(name) for name in FILTER_FIELDS}
    try:
        saved_filters.save_filter(request.user, workspace, request.POST.get("name"), query)
    except kernel.InvalidRequest as error:
        return saved_answer(request, workspace, error=error)
    return saved_answer(request, workspace)


@require_POST
@login_required
@not_found_as_404
def delete_filter(request: HtmxHttpRequest, slug: str, filter_id: int) -> HttpResponse:
    workspace = selectors.workspace_for(request.user, slug)
    saved_filters.delete_filter(request.user, workspace, filter_id)
    return saved_answer(request, workspace)


def saved_answer(request: HtmxHttpRequest, workspace: Workspace, *, error: kernel.InvalidRequest | None = None) -> HttpResponse:
    """htmx: the saved filters' fragment (a refusal in it, 200, so htmx swaps it); without htmx,
    back to the list (a refusal: the reason alone, 400)."""
    if request.htmx:
        context = {"workspace": workspace, "saved": saved_filters.saved_filters(request.user, workspace)}
        if error is not None:
            context |= {"error": error.detail, "error_key": error.key}
        return render(request, "runs/_saved_filters.html", context)
    if error is not None:
        return render(request, "console/_bulk_error.html", {"error": error.detail, "error_key": error.key}, status=error.status)
    return redirect("runs", slug=workspace.slug)
