"""The console's run pages: the workspace chooser, the runs list and the run page.

Views are short: resolve the object through a selector (a non-member gets 404), render
through the console's shared helpers. The run page is cut into regions (header, waiting
cards, graph, tasks, trace), one template each, used alike by the page, the htmx answer and
the live refresh; the live refresh sends only what changed: the regions when they differ
from what the browser shows (else 204) and the trace events after the last one it has.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET

from console.views import HtmxHttpRequest, fragment_or_page, live_fragment, not_found_as_404, wants_fragment, workspace_context
from inbox.selectors import waiting_items
from runs import kernel, selectors
from runs.holds import hold_documents
from runs.models import RUN_FINISHED, TASK_FAILED, TraceEvent

RUN_STATUS_FILTERS = ("running", "needs_attention", "paused", "pending", "canceling", "completed", "canceled")
TRACE_LIMIT = 2000
SEQ_MAX = 2**63 - 1


@login_required
def home(request: HttpRequest) -> HttpResponse:
    memberships = list(selectors.workspaces_of(request.user))
    if len(memberships) == 1:
        return redirect("inbox", slug=memberships[0].workspace.slug)
    return render(request, "runs/home.html", {"memberships": memberships})


@login_required
def workspace_home(request: HttpRequest, slug: str) -> HttpResponse:
    return redirect("inbox", slug=slug)


@require_GET
@login_required
@not_found_as_404
def runs_list(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    workspace = selectors.workspace_for(request.user, slug)
    status = request.GET.get("status") or None
    if status and any(s not in RUN_STATUS_FILTERS for s in status.split(",")):
        status = None
    agent = request.GET.get("agent") or None
    try:
        page = selectors.runs_page(
            request.user, workspace, status=status, agent=agent, cursor=request.GET.get("cursor"), limit=50
        )
    except kernel.KernelError:
        page = {"count": 0, "items": [], "next": None}
    context = workspace_context(request, workspace, "runs") | {
        "page": page,
        "status": status or "",
        "agent": agent or "",
        "statuses": RUN_STATUS_FILTERS,
        "more": bool(request.GET.get("cursor")),
    }
    if context["more"] and wants_fragment(request):  # "Load more" appends rows
        return fragment_or_page(request, "runs/runs.html", "runs/_run_rows.html", context)
    # The live refresh replaces the table with its count.
    return live_fragment(request, "runs/runs.html", "runs/_runs_table.html", context)


@require_GET
@login_required
@not_found_as_404
def run_detail(request: HtmxHttpRequest, run_id: Any) -> HttpResponse:
    after = trace_position(request.GET.get("after"))
    if after is None:
        return HttpResponseBadRequest("`after` is the seq of a trace event: a whole number from 0")
    run = selectors.run_for(request.user, run_id)
    doc = selectors.run_document(request.user, run)
    repair = None
    if run.status not in RUN_FINISHED and any(t["status"] in TASK_FAILED for t in doc["tasks"]):
        repair = hold_documents(request.user, [run])[0]
    context = workspace_context(request, run.workspace, "runs") | {
        "run": run,
        "doc": doc,
        "repair": repair,
        "waiting": waiting_items(request.user, run),
        "model_changes": [
            (t["key"], t["result"]["model_change"]) for t in doc["tasks"] if (t["result"] or {}).get("model_change")
        ],
        "finished": run.status in RUN_FINISHED,
        "live_path": f"/ws/runs/{run.pk}/",
    }
    if wants_fragment(request):
        later, after = trace_after(request, run, after)
        return live_fragment(request, "runs/run.html", "runs/_run_live.html", context, state={"after": after}, extra=later)
    trace = selectors.trace_documents(request.user, run, limit=TRACE_LIMIT)
    after = trace[-1]["seq"] if trace else 0
    context |= trace_context(trace, shown=len(trace))
    return live_fragment(request, "runs/run.html", "runs/_run_live.html", context, state={"after": after})


def trace_position(value: str | None) -> int | None:
    """The `after` of a trace request: absent is 0; anything but a whole number a seq can be is None."""
    if value is None:
        return 0
    if not (value.isascii() and value.isdigit()) or len(value) > 19 or int(value) > SEQ_MAX:
        return None
    return int(value)


def trace_context(trace: list[dict[str, Any]], *, shown: int) -> dict[str, Any]:
    return {"trace": trace, "shown": shown, "trace_truncated": shown >= TRACE_LIMIT}


def trace_after(request: HttpRequest, run: Any, after: int) -> tuple[str, int]:
    """The trace events after `after` as out-of-band markup that appends them to the rows the
    browser has (up to TRACE_LIMIT shown in all), and the seq the browser then has."""
    shown = TraceEvent.objects.filter(run=run, seq__lte=after).count() if after else 0
    trace = selectors.trace_documents(request.user, run, after=after, limit=max(0, TRACE_LIMIT - shown))
    if not trace:
        return "", after
    context = trace_context(trace, shown=shown + len(trace)) | {"oob": True}
    return render_to_string("runs/_trace_more.html", context, request=request), trace[-1]["seq"]
