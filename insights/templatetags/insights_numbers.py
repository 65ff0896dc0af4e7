"""The date range and the numbers of the Agents page and a scorecard, for their templates.

Both read the range from the request (`?days=`, `?from=`/`?to=`, `?bucket=`: insights.numbers.parse_range).
A malformed range is never an error page: the page says what is wrong and shows the default range.
Only counts, tokens, costs and durations come out of here, never a failure's words, so every role
that may see the page (viewer and up) sees them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from django import template

from insights import charts, numbers, overview
from runs.kernel import InvalidRequest

register = template.Library()


def _period(request: Any) -> tuple[numbers.Range, str | None]:
    try:
        return numbers.parse_range(request.GET), None
    except InvalidRequest as error:
        return numbers.parse_range({}), str(error.detail)


def _range_context(request: Any, period: numbers.Range, error: str | None) -> dict[str, Any]:
    given = {k: request.GET.get(k, "")[:40] for k in ("days", "from", "to", "bucket")}
    return {
        "period": period,
        "error": error,
        # The range's parameters for links that keep it ("" for the default range: plain links stay plain).
        "keep": "" if period == numbers.parse_range({}) else urlencode(period.query()),
        "presets": numbers.PRESETS,
        # What the form shows: what was typed when it was wrong (to correct it), else the range.
        "from": given["from"] if error else period.since.isoformat(),
        "to": given["to"] if error else period.until.isoformat(),
        "min_runs": numbers.MIN_RUNS,
    }


@register.simple_tag(takes_context=True)
def agents_numbers(context: Mapping[str, Any]) -> dict[str, Any]:
    """The Agents page in the request's range, sorted by `?sort=` (default: the volume-aware rank)."""
    request, workspace = context["request"], context["workspace"]
    period, error = _period(request)
    sort = overview.sort_key(request.GET.get("sort"))
    agents = overview.agents_overview(workspace, sort=sort, period=period)
    top = max((a["runs"] for a in agents), default=0) or 1
    for a in agents:
        a["volume_width"] = round(100 * a["runs"] / top, 1)
    return _range_context(request, period, error) | {"agents": agents, "sort": sort}


@register.simple_tag(takes_context=True)
def scorecard_numbers(context: Mapping[str, Any]) -> dict[str, Any]:
    """The agent's runs, failures, tokens, cost and durations in the range: per version and per bucket."""
    request, workspace = context["request"], context["workspace"]
    period, error = _period(request)
    doc = numbers.agent_numbers(context["agent"], period, workspace_ids=[workspace.pk])
    return _range_context(request, period, error) | {"numbers": doc, "charts": charts.range_charts(doc)}


@register.filter
def seconds(value: Any) -> str:
    return charts.seconds_label(value)


@register.filter
def compact(value: Any) -> str:
    return charts.short_number(value)


@register.filter
def percent(value: Any) -> str:
    return "—" if value is None else f"{float(value) * 100:.1f}".rstrip("0").rstrip(".") + "%"
