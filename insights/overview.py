"""The Agents page's data: every agent of a workspace with its last 30 days per version,
read from the rollups the triggers keep (insights.models), so its cost does not grow
with the number of findings — four queries whatever the workspace holds.

The numbers are the scorecard's (`selectors.scorecard` with `since` 29 days before today
and the workspace): the same daily rollup rows, summed the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, timedelta
from typing import Any

from django.db.models import Count, Sum
from django.utils import timezone

from insights import numbers
from insights.models import FailureDaily, RunDaily
from oz0agents.models import Agent
from runs.models import Run, RunStatus
from tenancy.models import Workspace

WINDOW_DAYS = 30
TOP_KINDS = 3
CHART_VERSIONS = 6
SPARK_W, SPARK_H, SPARK_PAD = 120, 36, 2


def _rate(failed: int, runs: int) -> float | None:
    return round(failed / runs, 4) if runs else None


def window_start(today: date | None = None) -> date:
    """The first day of the window: today and the 29 days before it (UTC days, as the rollups)."""
    today = today or timezone.now().astimezone(UTC).date()
    return today - timedelta(days=WINDOW_DAYS - 1)


def _desc(key: str) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """Largest first; agents without a value (no runs, no previous version) last; then by name."""
    return lambda a: (a[key] is None, -(a[key] or 0), a["name"])


# The whitelist of `?sort=`: anything else is the default, never an error. `risk` (the default)
# is the volume-aware rank (insights.numbers.rank_key): the lower bound of the failure rate's
# 95 % interval, agents with fewer than numbers.MIN_RUNS runs after the rest.
SORTS: dict[str, Callable[[dict[str, Any]], tuple[Any, ...]]] = {
    "risk": numbers.rank_key,
    "rate": _desc("rate"),
    "failed": _desc("failed"),
    "runs": _desc("runs"),
    "holds": _desc("holds"),
    "change": _desc("change"),
    "name": lambda a: (a["name"],),
}
DEFAULT_SORT = "risk"
SORT_COLUMNS = [
    ("name", "Agent"),
    ("risk", "Fails at least"),
    ("runs", "Runs"),
    ("failed", "Failed"),
    ("rate", "Failure rate"),
    ("holds", "Open holds"),
    ("change", "Change since previous version"),
]


def sort_key(value: str | None) -> str:
    return value if value in SORTS else DEFAULT_SORT


def agents_overview(
    workspace: Workspace, *, sort: str | None = None, today: date | None = None, period: numbers.Range | None = None
) -> list[dict[str, Any]]:
    """Every agent with its numbers in `period` (default: the last WINDOW_DAYS days), sorted by `sort`."""
    period = period or numbers.Range(window_start(today), today or numbers.today_utc(), "day", WINDOW_DAYS)
    since, until = period.since, period.until
    names = set(Agent.objects.filter(workspace=workspace).values_list("name", flat=True))
    runs: dict[str, dict[int, int]] = {}
    for row in (
        RunDaily.objects.filter(workspace_id=workspace.pk, day__gte=since, day__lte=until)
        .values("agent_name", "agent_version")
        .annotate(n=Sum("started"))
    ):
        runs.setdefault(row["agent_name"], {})[row["agent_version"]] = int(row["n"])
    failed: dict[str, dict[int, dict[str, int]]] = {}
    for row in (
        FailureDaily.objects.filter(workspace_id=workspace.pk, day__gte=since, day__lte=until)
        .values("agent_name", "agent_version", "kind")
        .annotate(n=Sum("failed"))
    ):
        failed.setdefault(row["agent_name"], {}).setdefault(row["agent_version"], {})[row["kind"]] = int(row["n"])
    holds = dict(
        Run.objects.filter(workspace=workspace, status=RunStatus.NEEDS_ATTENTION)
        .exclude(agent_name="")
        .values_list("agent_name")
        .annotate(n=Count("id"))
        .order_by()
    )
    names |= set(runs) | set(failed)
    names.discard("")  # runs without an agent have no scorecard
    measures = numbers.workspace_usage(workspace.pk, period)
    agents = [_agent(name, runs.get(name, {}), failed.get(name, {}), int(holds.get(name, 0)), since) for name in names]
    for agent in agents:
        agent |= numbers.risk(agent["failed"], agent["runs"]) | {
            "usage": measures.get(agent["name"], numbers.EMPTY_USAGE),
            "query": findings_query(agent["name"], since, until=until),
        }
        for kind in agent["top_kinds"]:
            kind["query"] = findings_query(agent["name"], since, kind["kind"], until=until)
    return sorted(agents, key=SORTS[sort_key(sort)])


def findings_query(agent: str, since: date, kind: str | None = None, *, until: date | None = None) -> str:
    """The findings search (insights.search) that lists what a count on this page counts."""
    query = (f"finding:failure_{kind} " if kind else "") + f"agent:{agent} since:{since.isoformat()}"
    return query + (f" until:{until.isoformat()}" if until and until < numbers.today_utc() else "")


def _agent(name: str, runs: dict[int, int], failed: dict[int, dict[str, int]], holds: int, since: date) -> dict[str, Any]:
    versions = []
    by_kind: dict[str, int] = {}
    for version in sorted(set(runs) | set(failed)):
        counts = failed.get(version, {})
        for kind, n in counts.items():
            by_kind[kind] = by_kind.get(kind, 0) + n
        n_failed = sum(counts.values())
        versions.append(
            {
                "version": version or None,
                "runs": runs.get(version, 0),
                "failed": n_failed,
                "rate": _rate(n_failed, runs.get(version, 0)),
            }
        )
    total_runs, total_failed = sum(runs.values()), sum(by_kind.values())
    # The change a version made: the newest version with runs against the one before it.
    rated = [(v["version"], float(v["rate"])) for v in versions if v["version"] is not None and v["rate"] is not None]
    change = round(rated[-1][1] - rated[-2][1], 4) if len(rated) >= 2 else None
    return {
        "name": name,
        "runs": total_runs,
        "failed": total_failed,
        "rate": _rate(total_failed, total_runs),
        "versions": versions,
        "top_kinds": [
            {"kind": kind, "failed": n, "query": findings_query(name, since, kind)}
            for kind, n in sorted(by_kind.items(), key=lambda item: (-item[1], item[0]))[:TOP_KINDS]
        ],
        "holds": holds,
        "query": findings_query(name, since),
        "change": change,
        # In percentage points: a rate of 40 % after 10 % reads "+30 pts".
        "change_label": f"{change * 100:+.0f} pts" if change is not None else None,
        "change_versions": (rated[-2][0], rated[-1][0]) if change is not None else None,
        "chart": version_bars(versions),
    }


def version_bars(versions: list[dict[str, Any]]) -> dict[str, Any]:
    """A sparkline of bars, one per version (the newest CHART_VERSIONS), as tall as its failure rate
    against a fixed 100 % top so two agents' charts compare; SVG geometry only, styled by classes."""
    shown = versions[-CHART_VERSIONS:]
    slot = (SPARK_W - SPARK_PAD * 2) / CHART_VERSIONS
    plot_h = SPARK_H - SPARK_PAD * 2
    bars = []
    for index, version in enumerate(shown):
        rate = version["rate"] or 0
        height = round(max(plot_h * rate, 1 if version["runs"] else 0), 1)
        label = f"v{version['version']}" if version["version"] else "unversioned"
        percent = f"{round(rate * 100)}%" if version["rate"] is not None else "—"
        bars.append(
            {
                "x": round(SPARK_PAD + index * slot + 1, 1),
                "y": round(SPARK_PAD + plot_h - height, 1),
                "width": round(slot - 2, 1),
                "height": height,
                "title": f"{label}: {percent} of {version['runs']} runs failed",
            }
        )
    return {"bars": bars, "width": SPARK_W, "height": SPARK_H, "base": SPARK_H - SPARK_PAD}
