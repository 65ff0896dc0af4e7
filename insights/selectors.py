"""Scorecards (F18): an agent's failed runs by kind, in all and per version, with rates,
the trend per day and repairs — read from the rollups the triggers keep (insights.models).
Per version too: the runs per digest of the code they ran (a code change under the same manifest
shows as a second digest of one version), and the model calls' tokens and cost (genai-prices).
Those two are all-time totals: a windowed scorecard leaves them out (null).

The statements are built by `scorecard_statements` so that the benchmark
(bench/scorecard.py) times exactly the SQL the API runs.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from insights.groups import group_rows, top_groups_statement
from oz0agents.models import Agent, AgentVersion
from runs import failures
from runs.kernel import NotFound
from runs.usage_prices import model_of, usage_cost
from tenancy.models import Membership

# Without `since`, the trend shows this many days up to today; counts cover all time.
TREND_DAYS = 30
TREND_DAYS_MAX = 366

Statement = tuple[str, str, list[Any]]


def _where(
    agent: str, version: int | None, workspace_ids: list[int] | None, since: date | None, until: date | None
) -> tuple[str, list[Any]]:
    clauses = ["agent_name = %s"]
    params: list[Any] = [agent]
    if version is not None:
        clauses.append("agent_version = %s")
        params.append(version)
    if workspace_ids is not None:
        clauses.append("workspace_id = ANY(%s)")
        params.append(list(workspace_ids))
    if since is not None:
        clauses.append("day >= %s")
        params.append(since)
    if until is not None:
        clauses.append("day <= %s")
        params.append(until)
    return " AND ".join(clauses), params


def scorecard_statements(
    agent: str,
    version: int | None = None,
    since: date | None = None,
    until: date | None = None,
    *,
    workspace_ids: list[int] | None = None,
    trend_since: date | None = None,
) -> list[Statement]:
    """The five grouped reads of a scorecard, each over one agent's rollup rows, and its top failure groups.

    Counts with no date window read the all-time totals; a window reads the daily rows.
    The trend always reads the daily rows of its own (bounded) window.
    """
    where, params = _where(agent, version, workspace_ids, since, until)
    trend_where, trend_params = _where(agent, version, workspace_ids, trend_since or since, until)
    windowed = since is not None or until is not None
    if not windowed:
        where, params = _where(agent, version, workspace_ids, None, None)
    failed_table = "insights_failuredaily" if windowed else "insights_failuretotal"
    runs_table = "insights_rundaily" if windowed else "insights_runtotal"
    repairs_table = "insights_repairdaily" if windowed else "insights_repairtotal"
    return [
        ("failed", f"SELECT agent_version, kind, sum(failed) FROM {failed_table} WHERE {where} GROUP BY 1, 2", params),
        ("runs", f"SELECT agent_version, sum(started) FROM {runs_table} WHERE {where} GROUP BY 1", params),
        (
            "trend_failed",
            f"SELECT day, kind, sum(failed) FROM insights_failuredaily WHERE {trend_where} GROUP BY 1, 2",
            trend_params,
        ),
        ("trend_runs", f"SELECT day, sum(started) FROM insights_rundaily WHERE {trend_where} GROUP BY 1", trend_params),
        (
            "repairs",
            "SELECT agent_version, resolution, sum(repairs), sum(held), sum(held_seconds), max(held_seconds_max) "
            f"FROM {repairs_table} WHERE {where} GROUP BY 1, 2",
            params,
        ),
        top_groups_statement(agent, version, since, until, workspace_ids=workspace_ids),
        *(_code_and_usage_statements(agent, version, workspace_ids) if not windowed else []),
    ]


def _code_and_usage_statements(agent: str, version: int | None, workspace_ids: list[int] | None) -> list[Statement]:
    where, params = _where(agent, version, workspace_ids, None, None)
    return [
        (
            "code",
            "SELECT agent_version, code_digest, sum(started), min(first_started_at) "
            f"FROM insights_coderuntotal WHERE {where} GROUP BY 1, 2",
            params,
        ),
        (
            "usage",
            "SELECT agent_version, code_digest, route, sum(calls), sum(input_tokens), sum(output_tokens) "
            f"FROM insights_usagetotal WHERE {where} GROUP BY 1, 2, 3",
            params,
        ),
    ]


def as_day(value: date | datetime | None) -> date | None:
    if value is None or (isinstance(value, date) and not isinstance(value, datetime)):
        return value
    return value.astimezone(UTC).date() if timezone.is_aware(value) else value.date()


def _days_before(day: date, days: int) -> date:
    """`day` less `days` days, stopping at the first day there is (an `until:0001-01-05`)."""
    return day - timedelta(days=min(days, (day - date.min).days))


def _rate(failed: int, runs: int) -> float | None:
    return round(failed / runs, 4) if runs else None


def _kind_flags(agent: str, workspace_ids: list[int] | None) -> dict[str, dict[str, Any]]:
    """Flags of every kind the versions of the agents of that name declare (in those workspaces), then the platform's."""
    flags: dict[str, dict[str, Any]] = {}
    versions = AgentVersion.objects.filter(agent__name=agent)
    if workspace_ids is not None:
        versions = versions.filter(agent__workspace_id__in=workspace_ids)
    for manifest in versions.order_by("version", "pk").values_list("manifest", flat=True):
        for declared in (manifest or {}).get("failures", []) or []:
            if isinstance(declared, dict) and "kind" in declared:
                flags[declared["kind"]] = {**failures.declared_failure(declared, None), "declared": True}
    for kind in failures.PLATFORM_KINDS:
        flags[kind] = failures.platform_failure(kind, None)
    return flags


def _by_kind(counts: dict[str, int], runs: int, flags: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for kind, failed in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        known = flags.get(kind, {})
        rows.append(
            {
                "kind": kind,
                "failed": failed,
                "rate": _rate(failed, runs),
                "retryable": known.get("retryable"),
                "partial": known.get("partial"),
                "person": known.get("person"),
                "declared": known.get("declared", kind not in failures.PLATFORM_KINDS),
            }
        )
    return rows


def member_workspace_ids(user: Any) -> list[int]:
    return list(Membership.objects.filter(user_id=user.pk).values_list("workspace_id", flat=True))


def scorecard(
    agent: str,
    version: int | None = None,
    since: date | datetime | None = None,
    until: date | datetime | None = None,
    *,
    workspace_ids: list[int] | None = None,
) -> dict[str, Any]:
    """An agent's scorecard; `workspace_ids` limits it to those workspaces (None: every one)."""
    since_day, until_day = as_day(since), as_day(until)
    today = timezone.now().astimezone(UTC).date()
    trend_end = until_day or today
    # The trend is a window: the days since `since` (at most TREND_DAYS_MAX), else the last TREND_DAYS.
    trend_since = (
        max(since_day, _days_before(trend_end, TREND_DAYS_MAX - 1)) if since_day else _days_before(trend_end, TREND_DAYS - 1)
    )
    results: dict[str, list[tuple[Any, ...]]] = {}
    with connection.cursor() as cursor:
        for name, sql, params in scorecard_statements(
            agent, version, since_day, until_day, workspace_ids=workspace_ids, trend_since=trend_since
        ):
            cursor.execute(sql, params)
            results[name] = cursor.fetchall()
    agents = Agent.objects.filter(name=agent)
    if workspace_ids is not None:
        agents = agents.filter(workspace_id__in=workspace_ids)
    if not any(results.values()) and not agents.exists():
        raise NotFound("agent")
    return build_scorecard(
        agent,
        version,
        since_day,
        until_day,
        trend_since,
        results,
        _kind_flags(agent, workspace_ids),
        registered_code=_registered_code(agent, workspace_ids),
    )


def _registered_code(agent: str, workspace_ids: list[int] | None) -> dict[int, set[str]]:
    """The code digests the versions of the agents of that name were registered with, per version."""
    versions = AgentVersion.objects.filter(agent__name=agent).exclude(code_digest="")
    if workspace_ids is not None:
        versions = versions.filter(agent__workspace_id__in=workspace_ids)
    found: dict[int, set[str]] = {}
    for number, digest in versions.values_list("version", "code_digest"):
        found.setdefault(number, set()).add(digest)
    return found


def code_and_usage(
    results: dict[str, list[tuple[Any, ...]]], registered_code: dict[int, set[str]]
) -> tuple[dict[int, list[dict[str, Any]]], dict[int, dict[str, Any]], dict[str, Any] | None]:
    """Per version: its runs per code digest (oldest code first, each with its calls' tokens and
    cost, and whether it is the code the version was registered with), and its tokens and cost;
    then the tokens and cost of all versions. Empty (and None) for a windowed scorecard."""
    if "code" not in results:
        return {}, {}, None
    usage_rows: dict[tuple[int, str], list[tuple[str, str | None, int, int, int]]] = {}
    for v, digest, route, calls, input_tokens, output_tokens in results["usage"]:
        model, provider = model_of({"route": route})
        usage_rows.setdefault((int(v), digest), []).append((model, provider, int(input_tokens), int(output_tokens), int(calls)))
    code: dict[int, list[dict[str, Any]]] = {}
    for v, digest, started, first in sorted(results["code"], key=lambda row: (row[0], row[3], row[1])):
        code.setdefault(int(v), []).append(
            {
                "digest": digest or None,
                "runs": int(started),
                "first_run_at": first.isoformat() if first else None,
                "registered": digest in registered_code.get(int(v), set()),
                "usage": usage_cost(usage_rows.get((int(v), digest), [])),
            }
        )
    by_version: dict[int, dict[str, Any]] = {}
    for v in {v for v, _ in usage_rows} | set(code):
        by_version[v] = usage_cost(row for (of, _), rows in usage_rows.items() if of == v for row in rows)
    return code, by_version, usage_cost(row for rows in usage_rows.values() for row in rows)


def build_scorecard(
    agent: str,
    version: int | None,
    since: date | None,
    until: date | None,
    trend_since: date,
    results: dict[str, list[tuple[Any, ...]]],
    flags: dict[str, dict[str, Any]],
    *,
    registered_code: dict[int, set[str]] | None = None,
) -> dict[str, Any]:
    runs_by_version = {int(v): int(n) for v, n in results["runs"]}
    code_by_version, usage_by_version, usage = code_and_usage(results, registered_code or {})
    failed_by_version: dict[int, dict[str, int]] = {}
    for v, kind, n in results["failed"]:
        failed_by_version.setdefault(int(v), {})[kind] = int(n)
    repairs_by_version: dict[int, dict[str, tuple[int, int, float, float]]] = {}
    for v, resolution, n, held, held_seconds, held_max in results["repairs"]:
        repairs_by_version.setdefault(int(v), {})[resolution] = (int(n), int(held), float(held_seconds), float(held_max))

    def repairs_of(versions: list[int]) -> dict[str, Any]:
        merged = {"retried": 0, "abandoned": 0}
        held = 0
        held_seconds = 0.0
        held_max: float | None = None
        for v in versions:
            for resolution, (n, h, seconds, longest) in repairs_by_version.get(v, {}).items():
                merged[resolution] = merged.get(resolution, 0) + n
                held += h
                held_seconds += seconds
                if h:
                    held_max = longest if held_max is None else max(held_max, longest)
        return {
            **merged,
            "after_hold": held,
            "hold_to_repair_mean_seconds": round(held_seconds / held, 3) if held else None,
            "hold_to_repair_max_seconds": round(held_max, 3) if held_max is not None else None,
        }

    all_versions = sorted(
        set(runs_by_version) | set(failed_by_version) | set(repairs_by_version) | set(code_by_version) | set(usage_by_version)
    )
    total_runs = sum(runs_by_version.values())
    total_by_kind: dict[str, int] = {}
    for counts in failed_by_version.values():
        for kind, n in counts.items():
            total_by_kind[kind] = total_by_kind.get(kind, 0) + n
    total_failed = sum(total_by_kind.values())

    versions = []
    for v in sorted(all_versions, reverse=True):
        counts = failed_by_version.get(v, {})
        runs = runs_by_version.get(v, 0)
        failed = sum(counts.values())
        versions.append(
            {
                "version": v or None,
                "runs": runs,
                "failed": failed,
                "rate": _rate(failed, runs),
                "by_kind": _by_kind(counts, runs, flags),
                "repairs": repairs_of([v]),
                "code": code_by_version.get(v, []) if usage is not None else None,
                "usage": usage_by_version.get(v, usage_cost([])) if usage is not None else None,
            }
        )

    trend_runs = {d: int(n) for d, n in results["trend_runs"]}
    trend_failed: dict[date, dict[str, int]] = {}
    for d, kind, n in results["trend_failed"]:
        trend_failed.setdefault(d, {})[kind] = int(n)
    last_day = until or timezone.now().astimezone(UTC).date()
    trend = []
    day = trend_since
    while day <= last_day:
        counts = trend_failed.get(day, {})
        runs = trend_runs.get(day, 0)
        failed = sum(counts.values())
        trend.append(
            {
                "day": day.isoformat(),
                "runs": runs,
                "failed": failed,
                "rate": _rate(failed, runs),
                "by_kind": dict(sorted(counts.items())),
            }
        )
        if day >= last_day:  # never step past date.max
            break
        day += timedelta(days=1)

    return {
        "agent": agent,
        "version": version,
        "since": since.isoformat() if since else None,
        "until": until.isoformat() if until else None,
        "runs": total_runs,
        "failed": total_failed,
        "rate": _rate(total_failed, total_runs),
        "by_kind": _by_kind(total_by_kind, total_runs, flags),
        "versions": versions,
        "trend": trend,
        "repairs": repairs_of(all_versions),
        "usage": usage,
        "groups": group_rows(results.get("top_groups", [])),
    }
