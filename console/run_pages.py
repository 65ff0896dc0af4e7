"""The console's run pages: the workspace chooser and the run page (the runs list is
console/run_list_pages.py).

Views are short: resolve the object through a selector (a non-member gets 404), render
through the console's shared helpers. The run page is cut into regions (header, waiting
cards, graph, tasks, trace), one template each, used alike by the page, the htmx answer and
the live refresh; the live refresh sends only what changed: the regions when they differ
from what the browser shows (else 204) and the trace events after the newest one it has.

At any size (runs.run_page): fan-outs collapse into groups, the task table is one page
(filtered by status and group; the page and filter ride in the live state), the graph draws
a bounded number of nodes, the trace is newest first a page at a time (older pages and a
filter by task and event from `run_trace`), and a task's whole story opens in a drawer
(`task_drawer`). A bad query value is a typed 400 (`invalid_<field>: why`), never a 500.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_GET

from console.views import HtmxHttpRequest, fragment_or_page, live_fragment, not_found_as_404, wants_fragment, workspace_context
from inbox.selectors import waiting_items
from runs import kernel, run_page, selectors
from runs.holds import run_hold_document
from runs.models import RUN_FINISHED

# Events the trace's filter offers by name (any other well-formed name is accepted too).
KNOWN_EVENTS = (
    "status",
    "provider_call",
    "verb",
    "appended",
    "task_added",
    "expanded",
    "attention",
    "run_status",
    "announced",
    "approval_granted",
    "approval_denied",
    "approval_escalated",
    "auto_retry",
    "claim_expired",
    "lease_lost",
    "model_change",
    "harness_call",
    "child_started",
    "child_ended",
    "resolved",
)


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
def run_detail(request: HtmxHttpRequest, run_id: Any) -> HttpResponse:
    """The run page, and its htmx refresh: the regions (the task table at the page and filter
    asked), with the trace events after `after` riding along out of band when it is sent."""
    run = selectors.run_for(request.user, run_id)
    try:
        after = run_page.parse_seq(request.GET.get("after"), "after")
        table = {
            "status": run_page.parse_status(request.GET.get("status")),
            "group": run_page.parse_group(request.GET.get("group")),
            "page": run_page.parse_page(request.GET.get("page")),
        }
        task, event = run_page.parse_trace_filter(request.GET.get("task"), request.GET.get("event"))
    except kernel.InvalidRequest as error:
        return refusal(error)
    context = run_context(request, run, table)
    state = {name: value for name, value in table.items() if value and value != 1}
    if wants_fragment(request):
        later = "" if after is None else trace_after(request, run, after, task, event)
        return live_fragment(request, "runs/run.html", "runs/_run_live.html", context, state=state, extra=later)
    context["trace"] = run_page.trace_page(request.user, run)
    context["trace_after"] = context["trace"]["events"][0]["seq"] if context["trace"]["events"] else 0
    return live_fragment(request, "runs/run.html", "runs/_run_live.html", context, state=state)


def run_context(request: HtmxHttpRequest, run: Any, table: dict[str, Any]) -> dict[str, Any]:
    doc = run_page.run_page_document(request.user, run, **table)
    repair = run_hold_document(request.user, run) if run.status not in RUN_FINISHED and doc["has_failed"] else None
    return workspace_context(request, run.workspace, "runs") | {
        "run": run,
        "doc": doc,
        "repair": repair,
        "waiting": waiting_items(request.user, run),
        "finished": run.status in RUN_FINISHED,
        "statuses": run_page.TASK_STATUSES,
        "known_events": KNOWN_EVENTS,
        "live_path": f"/ws/runs/{run.pk}/",
    }


def refusal(error: kernel.KernelError) -> HttpResponse:
    """A bad query value: its typed key and why, as the API words it, never a 500."""
    response = HttpResponseBadRequest(f"{error.key}: {error.detail}", content_type="text/plain; charset=utf-8")
    response.status_code = error.status
    return response


def trace_after(request: HtmxHttpRequest, run: Any, after: int, task: str, event: str) -> str:
    """The trace events after `after` (those the trace's filter keeps) as out-of-band markup put
    on top of the rows the browser has, newest first, with the trace's new position; when more
    than a page of them came, the list is replaced by the newest page instead."""
    later = run_page.trace_since(request.user, run, after, task=task, event=event)
    if not later["events"]:
        return ""
    newest = later["events"][0]["seq"]
    # The events were read after the run row: ones committed in between are newer than its last_seq.
    context = {"run": run, "trace": later, "trace_after": newest, "total": max(run.last_seq, newest)}
    template = "runs/_trace_replace.html" if later["gap"] else "runs/_trace_more.html"
    return render_to_string(template, context, request=request)


@require_GET
@login_required
@not_found_as_404
def run_trace(request: HtmxHttpRequest, run_id: Any) -> HttpResponse:
    """The trace, newest first, filtered by task and event: the list (a new filter), or, with
    `before`, the older page after the rows the browser has."""
    run = selectors.run_for(request.user, run_id)
    try:
        task, event = run_page.parse_trace_filter(request.GET.get("task"), request.GET.get("event"))
        before = run_page.parse_seq(request.GET.get("before"), "before")
    except kernel.InvalidRequest as error:
        return refusal(error)
    trace = run_page.trace_page(request.user, run, task=task, event=event, before=before)
    context = {"run": run, "trace": trace, "total": run.last_seq, "known_events": KNOWN_EVENTS}
    if before is not None:
        response = render(request, "runs/_trace_older.html", context)
    else:
        context["trace_after"] = trace["events"][0]["seq"] if trace["events"] else 0
        response = render(request, "runs/_trace_list.html", context)
    patch_vary_headers(response, ("HX-Request",))
    return response


@require_GET
@login_required
@not_found_as_404
def task_drawer(request: HtmxHttpRequest, run_id: Any, key: str) -> HttpResponse:
    """One task whole, in the run page's drawer (or alone, without htmx)."""
    run = selectors.run_for(request.user, run_id)
    task = run_page.task_drawer(request.user, run, key)
    context = workspace_context(request, run.workspace, "runs") | {"run": run, "task": task}
    return fragment_or_page(request, "runs/task.html", "runs/_task_drawer.html", context)
