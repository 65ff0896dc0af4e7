"""Bulk repair: retry or abandon many held runs at once, from the Holds page or the JSON API.

Each run is what one click does (kernel.retry / kernel.abandon on each repair candidate the
filter chooses), in one transaction per run that first takes the run's row lock and checks,
under it, that the run is still held and still matches. Two operators racing therefore never
repair a run twice: whoever locks second finds it no longer held and answers `skipped` with
who repaired it. A kernel refusal inside a run rolls that run back whole and is told as
`skipped` with its key; the other runs are not affected.

The console runs a confirmed repair in chunks (CHUNK runs per request): each answer adds its
rows to the results and carries a form that fetches the next chunk on load, so progress shows
as it goes without a script of our own.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, QueryDict
from django.shortcuts import render
from django.views.decorators.http import require_POST

from console.views import HtmxHttpRequest, not_found_as_404, workspace_context
from runs import kernel, selectors
from runs.holds import BULK_CAP, HoldFilter, parse_hold_filter, select_held_runs, whose
from runs.repair import CHUNK, VERBS, repair_runs
from tenancy.models import Workspace
from tenancy.permissions import has_write_standing


def filter_from_form(data: QueryDict, workspace: Workspace, user: Any) -> HoldFilter:
    """The panel's fields as the API's filter: blank fields are absent, numbers are read as numbers;
    "created by me" is the signed-in person (the form names no one)."""
    body: dict[str, Any] = {}
    for name in ("agent", "kind", "error_key"):
        if data.get(name, "").strip():
            body[name] = data[name]
    for name in ("version", "min_age_seconds"):
        value = data.get(name, "").strip()
        if value:
            body[name] = int(value) if value.isdigit() and len(value) < 12 else value
    runs = [run for run in data.getlist("runs") if run]
    if runs:
        body["runs"] = runs
    if data.get("all"):
        body["all"] = True
    if data.get("mine"):
        body["mine"] = True
    return parse_hold_filter(body, workspace, user)


VERB_WORDS = {"retry": "Retry", "abandon": "Abandon", "abandon_and_cancel": "Abandon and cancel"}


def verb_of(data: QueryDict) -> str:
    verb = data.get("verb", "")
    if verb not in VERBS:
        raise kernel.InvalidRequest("invalid_verb", "verb must be retry, abandon or abandon_and_cancel")
    return verb


def operator_panel(view: Any) -> Any:
    """POST only, signed in, a member (404 otherwise), operator standing (403 otherwise); a bad
    filter answers the panel with the reason (400 without htmx, which swaps only a 2xx)."""

    def wrapper(request: HtmxHttpRequest, slug: str) -> HttpResponse:
        workspace = selectors.workspace_for(request.user, slug)
        if not has_write_standing(request.user, workspace.pk):
            return render(request, "console/_bulk_error.html", {"error": "Bulk repair needs the operator role."}, status=403)
        try:
            return view(request, workspace, verb_of(request.POST), filter_from_form(request.POST, workspace, request.user))
        except kernel.InvalidRequest as error:
            context = {"error": error.detail or error.key, "error_key": error.key}
            if request.htmx:
                return render(request, "console/_bulk_error.html", context)
            return render(request, "console/bulk_page.html", context | workspace_context(request, workspace, "holds"), status=400)

    wrapper.__name__ = wrapper.__qualname__ = view.__name__
    wrapper.__doc__ = view.__doc__
    return require_POST(login_required(not_found_as_404(wrapper)))


@operator_panel
def bulk_preview(request: HtmxHttpRequest, workspace: Workspace, verb: str, hold_filter: HoldFilter) -> HttpResponse:
    """How many held runs the selection repairs and which, whose they are (how many are other
    people's, how many private), each a ticked box: the confirmation repairs the ticked ones only."""
    chosen, more = select_held_runs(workspace, hold_filter, user=request.user)
    count = len(chosen)
    plural = "" if count == 1 else "s"
    described = hold_filter.describe()
    sentence = f"{VERB_WORDS[verb]} {count} held run{plural}{' ' + described if described else ''}"
    # Runs whose deliverable needs what an abandon gives up stay held after it: said before the click.
    stranded = sum(1 for item in chosen if item["strands_deliverable"]) if verb == "abandon" else 0
    context = {
        "workspace": workspace,
        "verb": verb,
        "verb_word": VERB_WORDS[verb],
        "chosen": chosen,
        "count": count,
        "more": more,
        "cap": BULK_CAP,
        "sentence": sentence,
        "stranded": stranded,
        "fields": [(name, value) for name, value in hold_filter.as_fields() if name != "runs"],
        "total": count,
        "whose": whose(chosen),
    }
    template = "console/_bulk_preview.html"
    if request.htmx:
        return render(request, template, context)
    return render(
        request, "console/bulk_page.html", context | workspace_context(request, workspace, "holds") | {"include": template}
    )


@operator_panel
def bulk_apply(request: HtmxHttpRequest, workspace: Workspace, verb: str, hold_filter: HoldFilter) -> HttpResponse:
    """Repair the ticked runs: a chunk at a time for htmx (the answer fetches the next), all at once
    without. Only runs the form names: a filter alone would repair what it matches now, which the
    person never saw. Each id is checked again, under its row lock, against the filter (runs/repair.py)."""
    if hold_filter.runs is None:
        raise kernel.InvalidRequest("no_runs_ticked", "tick at least one run of the preview to repair")
    run_ids = list(hold_filter.runs)
    chunk = run_ids[:CHUNK] if request.htmx else run_ids
    rest = run_ids[len(chunk) :]
    results = repair_runs(workspace, request.user, verb, hold_filter, chunk)
    done_before = _count(request.POST.get("done"))
    total = max(_count(request.POST.get("total")), len(run_ids) + done_before)
    context = {
        "workspace": workspace,
        "verb": verb,
        "results": results,
        "done": done_before + len(chunk),
        "total": total,
        "rest": [str(run) for run in rest],
        "fields": [(name, value) for name, value in hold_filter.as_fields() if name != "runs"],
    }
    if request.htmx:
        response = render(request, "console/_bulk_results.html", context)
        if not rest:
            response["HX-Trigger"] = "oz0:changed"
        return response
    return render(
        request,
        "console/bulk_page.html",
        context | workspace_context(request, workspace, "holds") | {"include": "console/_bulk_rows.html"},
    )


def _count(value: str | None) -> int:
    return int(value) if value and value.isdigit() and len(value) < 6 else 0
