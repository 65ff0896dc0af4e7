"""The scorecard page: how an agent fails, per version and over time, its top failure groups and
the findings search scoped to it; a failure group's page, where an operator marks it resolved."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from console.rollouts import rollouts_context
from console.views import HtmxHttpRequest, fragment_or_page, not_found_as_404, workspace_context
from insights import groups, overview, search, selectors
from insights.templatetags.insights_numbers import agents_numbers, scorecard_numbers
from runs import selectors as run_selectors
from runs.kernel import Forbidden, InvalidRequest

CHART_VERSIONS = 5
TIMELINE_VERSIONS, TIMELINE_KINDS = 8, 6
TIMELINE_W, TIMELINE_LABEL_W, TIMELINE_ROW_H, TIMELINE_TOP = 640, 170, 34, 4
CHART_W, CHART_H, CHART_PAD_L, CHART_PAD_B, CHART_PAD_T = 640, 220, 44, 26, 12


@require_GET
@login_required
@not_found_as_404
def scorecard(request: HtmxHttpRequest, slug: str, name: str) -> HttpResponse:
    workspace = run_selectors.workspace_for(request.user, slug)
    query = request.GET.get("q", "").strip()
    findings: dict[str, Any] = {"items": [], "next": None}
    query_error = None
    try:
        findings = search.search_findings(
            request.user, query, cursor=request.GET.get("cursor") or None, limit=25, workspace=workspace.slug, agent=name
        )
    except InvalidRequest as error:
        query_error = error.detail
    context = workspace_context(request, workspace, "agents") | {
        "agent": name,
        "query": query,
        "query_error": query_error,
        "findings": findings,
        "more": bool(request.GET.get("cursor")),
    }
    if request.htmx and not request.htmx.boosted:
        return fragment_or_page(request, "insights/scorecard.html", "insights/_findings.html", context)
    card = selectors.scorecard(name, workspace_ids=[workspace.pk])
    series = []
    for row in [v for v in card["versions"] if v["version"] is not None][:CHART_VERSIONS]:
        trend = selectors.scorecard(name, version=row["version"], workspace_ids=[workspace.pk])["trend"]
        series.append({"label": f"v{row['version']}", "points": [(p["day"], p["rate"], p["runs"]) for p in trend]})
    context |= {"card": card, "chart": rate_chart(series), "timeline": kind_timeline(card["versions"])}
    context["n"] = scorecard_numbers({"request": request, "workspace": workspace, "agent": name})
    return fragment_or_page(request, "insights/scorecard.html", "insights/_findings.html", context)


@require_GET
@login_required
@not_found_as_404
def agents(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    """Every agent of the workspace in the request's range (insights.numbers), ranked; `?sort=` from a whitelist."""
    workspace = run_selectors.workspace_for(request.user, slug)
    context = workspace_context(request, workspace, "agents")
    # The range's numbers once, here; the templates compute them only when a page is drawn without this view.
    context |= {"n": agents_numbers({"request": request, "workspace": workspace}), "sort_columns": overview.SORT_COLUMNS}
    context |= rollouts_context(request.user, workspace)
    return fragment_or_page(request, "insights/agents.html", "insights/_agents.html", context)


def _group_in(request: HtmxHttpRequest, slug: str, group_id: int) -> tuple[Any, dict[str, Any]]:
    """The workspace and the group's document; a group of another workspace is this one's 404."""
    workspace = run_selectors.workspace_for(request.user, slug)
    group = groups.group_detail(request.user, group_id)
    if group["workspace"] != workspace.slug:
        raise Http404("group")
    return workspace, group


@require_GET
@login_required
@not_found_as_404
def group(request: HtmxHttpRequest, slug: str, group_id: int) -> HttpResponse:
    """A failure group: counts and versions for every member, its shape for who may read its runs."""
    workspace, detail = _group_in(request, slug, group_id)
    context = workspace_context(request, workspace, "agents") | {"group": detail, "error": None}
    return fragment_or_page(request, "insights/group.html", "insights/_group_status.html", context)


@require_POST
@login_required
@not_found_as_404
def group_resolve(request: HtmxHttpRequest, slug: str, group_id: int) -> HttpResponse:
    """Mark resolved in the version the form names; the `reopen` button clears it."""
    workspace, detail = _group_in(request, slug, group_id)
    text = request.POST.get("version", "").strip()
    reopen = "reopen" in request.POST
    try:
        if not reopen and not (text.isdigit() and len(text) <= 10):
            raise InvalidRequest("invalid_version", "give the version number the group is fixed in")
        detail = groups.resolve(request.user, group_id, None if reopen else int(text))
    except Forbidden as error:
        return render(request, "insights/_group_status.html", _status(request, workspace, detail, error.detail), status=403)
    except InvalidRequest as error:
        return render(request, "insights/_group_status.html", _status(request, workspace, detail, error.detail), status=400)
    if request.htmx:
        return render(request, "insights/_group_status.html", _status(request, workspace, detail, None))
    messages.success(request, "Reopened." if reopen else f"Marked resolved in v{detail['resolved_in_version']}.")
    return redirect("group", slug=workspace.slug, group_id=group_id)


def _status(request: HtmxHttpRequest, workspace: Any, detail: dict[str, Any], error: str | None) -> dict[str, Any]:
    return workspace_context(request, workspace, "agents") | {"group": detail, "error": error}


def kind_timeline(versions: list[dict[str, Any]]) -> dict[str, Any]:
    """Each kind's failure rate per version, oldest version first: one row of bars per kind
    (the TIMELINE_KINDS commonest), so a version that made a kind rarer or commoner shows as
    a step in that kind's row. SVG geometry only; the template styles it by classes."""
    ordered = [v for v in reversed(versions) if v["version"] is not None][-TIMELINE_VERSIONS:]
    totals: dict[str, int] = {}
    for v in ordered:
        for k in v["by_kind"]:
            totals[k["kind"]] = totals.get(k["kind"], 0) + k["failed"]
    kinds = [kind for kind, _ in sorted(totals.items(), key=lambda item: (-item[1], item[0]))[:TIMELINE_KINDS]]
    if not ordered or not kinds:
        return {"rows": [], "columns": []}
    top = max((k["rate"] or 0) for v in ordered for k in v["by_kind"] if k["kind"] in kinds) or 1
    slot = (TIMELINE_W - TIMELINE_LABEL_W) / len(ordered)
    bar_h = TIMELINE_ROW_H - 8
    columns = [
        {"x": round(TIMELINE_LABEL_W + i * slot + slot / 2, 1), "label": f"v{v['version']}"} for i, v in enumerate(ordered)
    ]
    rows = []
    for r, kind in enumerate(kinds):
        base = TIMELINE_TOP + (r + 1) * TIMELINE_ROW_H - 4
        bars = []
        for i, v in enumerate(ordered):
            hit = next((k for k in v["by_kind"] if k["kind"] == kind), None)
            rate = (hit["rate"] or 0) if hit else 0
            height = round(bar_h * rate / top, 1)
            bars.append(
                {
                    "x": round(TIMELINE_LABEL_W + i * slot + slot * 0.2, 1),
                    "y": round(base - height, 1),
                    "width": round(slot * 0.6, 1),
                    "height": height,
                    "title": f"v{v['version']} {kind}: {hit['failed'] if hit else 0} of {v['runs']} runs ({round(rate * 100)}%)",
                }
            )
        rows.append({"kind": kind, "y": round(base - bar_h / 2, 1), "base": base, "bars": bars, "series": r % 6})
    height = TIMELINE_TOP + len(kinds) * TIMELINE_ROW_H + 18
    return {"rows": rows, "columns": columns, "width": TIMELINE_W, "height": height, "label_y": height - 4}


def rate_chart(series: list[dict[str, Any]]) -> dict[str, Any]:
    """Failure rate per version per day as SVG geometry: a polyline per version over
    shared day columns; days without runs leave a gap instead of drawing a zero."""
    days = sorted({p[0] for s in series for p in s["points"]})
    if not days:
        return {"lines": [], "days": [], "width": CHART_W, "height": CHART_H}
    top = max((p[1] or 0 for s in series for p in s["points"]), default=0)
    top = max(0.1, min(1.0, (int(top * 10) + 1) / 10))
    plot_w, plot_h = CHART_W - CHART_PAD_L - 8, CHART_H - CHART_PAD_B - CHART_PAD_T
    step = plot_w / max(1, len(days) - 1)
    x_of = {day: CHART_PAD_L + i * step for i, day in enumerate(days)}

    def y(rate: float) -> float:
        return round(CHART_PAD_T + plot_h * (1 - rate / top), 1)

    lines = []
    for index, s in enumerate(series):
        segments: list[str] = []
        current: list[str] = []
        dots = []
        for day, rate, runs in s["points"]:
            if rate is None:
                if current:
                    segments.append(" ".join(current))
                current = []
                continue
            point = f"{round(x_of[day], 1)},{y(rate)}"
            current.append(point)
            dots.append(
                {"x": round(x_of[day], 1), "y": y(rate), "title": f"{s['label']} {day}: {round(rate * 100)}% of {runs} runs"}
            )
        if current:
            segments.append(" ".join(current))
        lines.append({"label": s["label"], "segments": segments, "dots": dots, "series": index % 6})
    ticks = [{"y": y(top * f), "label": f"{round(top * f * 100)}%"} for f in (0, 0.5, 1)]
    labels = [{"x": round(x_of[d], 1), "label": d[5:]} for i, d in enumerate(days) if i % max(1, len(days) // 6) == 0]
    return {
        "lines": lines,
        "ticks": ticks,
        "labels": labels,
        "width": CHART_W,
        "height": CHART_H,
        "left": CHART_PAD_L,
        "right": CHART_W - 8,
        "bottom": CHART_H - CHART_PAD_B,
        "label_y": CHART_H - 8,
    }
