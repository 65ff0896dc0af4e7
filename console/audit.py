"""The audit page: the workspace's trail (runs/audit.py) with its filters, and its CSV export.

`?format=csv` streams every entry the filters select, a page of the trail at a time, with the
same redaction as the page and the API, and no cell a spreadsheet would run as a formula.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse, HttpResponseBadRequest, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.http import require_GET

from console.views import HtmxHttpRequest, fragment_or_page, wants_fragment, workspace_context
from runs import audit, kernel, selectors
from tenancy.models import Workspace

FILTER_NAMES = ("actor", "verb", "run", "since", "until")


class _Line:
    """csv.writer writes into this; each row comes back as its text for the stream."""

    def write(self, text: str) -> str:
        return text


@require_GET
@login_required
def audit_trail(request: HtmxHttpRequest, slug: str) -> HttpResponseBase:
    """The page, or with `?format=csv` the export (a streamed response, hence no page decorator)."""
    try:
        workspace = selectors.workspace_for(request.user, slug)
    except kernel.NotFound as error:
        raise Http404(error.detail) from None
    given = {name: (request.GET.get(name) or "").strip() for name in FILTER_NAMES}
    try:
        filters = audit.parse_filters(**{k: v or None for k, v in given.items()})
    except kernel.InvalidRequest as error:
        return HttpResponseBadRequest(error.detail)
    if request.GET.get("format") == "csv":
        return csv_export(request, workspace, filters)
    return audit_page(request, workspace, given, filters)


def audit_page(request: HtmxHttpRequest, workspace: Workspace, given: dict[str, str], filters: dict[str, Any]) -> HttpResponse:
    cursor = request.GET.get("cursor")
    try:
        page = audit.audit_page(request.user, workspace, filters, cursor=cursor, limit=50)
    except kernel.InvalidRequest:  # a cursor not of ours: start again at the first page
        cursor = None
        page = audit.audit_page(request.user, workspace, filters, limit=50)
    context = workspace_context(request, workspace, "audit") | {
        "page": page,
        "filters": given,
        "verbs": audit.VERBS,
        # The filters as a query string, for "Load more" and the CSV link.
        "query": urlencode([(k, v) for k, v in given.items() if v]),
        "more": bool(cursor),
    }
    if context["more"] and wants_fragment(request):  # "Load more" appends rows
        return fragment_or_page(request, "console/audit.html", "console/_audit_rows.html", context)
    return fragment_or_page(request, "console/audit.html", "console/_audit_table.html", context)


def csv_export(request: HtmxHttpRequest, workspace: Workspace, filters: dict[str, Any]) -> StreamingHttpResponse:
    writer = csv.writer(_Line())

    def rows() -> Iterator[str]:
        yield writer.writerow(audit.CSV_COLUMNS)
        for entry in audit.all_entries(request.user, workspace, filters):
            yield writer.writerow(audit.csv_row(entry))

    response = StreamingHttpResponse(rows(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="audit-{workspace.slug}.csv"'
    return response
