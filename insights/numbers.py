"""Numbers a manager can trust (issue 31): a validated date range with daily or weekly buckets,
a volume-aware ranking of agents, and tokens, cost and run duration (p50, p95) per agent and
version with their trends — all read from the summary rows the triggers keep (insights.models),
never from the runs, findings or trace events themselves.

Days are UTC days, as in every rollup; a week starts on Monday (ISO 8601). A bucket that the
range cuts (the first or last week) says so (`partial`).

Ranking: an agent's failure rate over few runs says little (one failed run is 100 %). Agents are
ranked by the lower bound of the 95 % Wilson score interval of their failure rate — the rate they
fail at least, with 95 % confidence — and an agent with fewer than MIN_RUNS runs in the range is
ranked after every agent with enough, however high its rate. The volume is shown next to it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, timedelta
from decimal import Decimal
from functools import lru_cache
from typing import Any

from django.db import connection
from django.utils import timezone

from runs.kernel import InvalidRequest
from runs.usage_prices import CENT_DIGITS, model_of, price

PRESETS = (7, 30, 90)
DEFAULT_DAYS = 30
MAX_DAYS = 366
MIN_RUNS = 10
Z = 1.959963984540054  # the 97.5th percentile of the normal distribution: a 95 % interval
BIN_BASE = 1.1  # a duration bin is 10 % wide (the migration's floor(ln(ms) / ln(1.1)))
BUCKETS = ("day", "week")
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")

Statement = tuple[str, str, list[Any]]


@dataclass(frozen=True)
class Range:
    since: date
    until: date
    bucket: str
    preset: int | None  # 7, 30 or 90; None for a custom from/to

    @property
    def days(self) -> int:
        return (self.until - self.since).days + 1

    def query(self) -> dict[str, str]:
        """The parameters that give this range back (for links that keep it)."""
        if self.preset is not None:
            return {"days": str(self.preset), "bucket": self.bucket}
        return {"from": self.since.isoformat(), "to": self.until.isoformat(), "bucket": self.bucket}


def today_utc() -> date:
    return timezone.now().astimezone(UTC).date()


def _one(params: Mapping[str, Any], key: str) -> str:
    """One parameter as text; a list (a repeated parameter) is its last value, as Django's QueryDict."""
    getter = getattr(params, "get", None)
    value = getter(key, "") if getter else ""
    if isinstance(value, list):
        value = value[-1] if value else ""
    return str(value or "").strip()


def _day(text: str, name: str) -> date:
    if len(text) > 10 or not _DAY.fullmatch(text):
        raise InvalidRequest("invalid_range", f"{name}: give a day as YYYY-MM-DD (for example 2026-01-31)")
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise InvalidRequest("invalid_range", f"{name}: {text} is not a day of the calendar") from None


def parse_range(params: Mapping[str, Any], today: date | None = None) -> Range:
    """The range of `?days=7|30|90` or `?from=YYYY-MM-DD&to=YYYY-MM-DD`, and `?bucket=day|week`.

    Nothing given: the last DEFAULT_DAYS days. A custom range missing `to` ends today; missing
    `from`, it is the DEFAULT_DAYS days up to `to`. A `to` after today is today. Anything else
    malformed raises InvalidRequest with a sentence that says what to give."""
    today = today or today_utc()
    days_text, since_text, until_text, bucket = (_one(params, k) for k in ("days", "from", "to", "bucket"))
    if bucket and bucket not in BUCKETS:
        raise InvalidRequest("invalid_range", "bucket: choose day or week")
    preset: int | None = None
    if since_text or until_text:
        if days_text:
            raise InvalidRequest("invalid_range", "give either days or from/to, not both")
        until = min(_day(until_text, "to"), today) if until_text else today
        since = _day(since_text, "from") if since_text else until - timedelta(days=DEFAULT_DAYS - 1)
        if since > until:
            raise InvalidRequest("invalid_range", f"from ({since.isoformat()}) is after to ({until.isoformat()})")
        if (until - since).days + 1 > MAX_DAYS:
            raise InvalidRequest("invalid_range", f"a range is at most {MAX_DAYS} days")
    else:
        if days_text and days_text not in {str(p) for p in PRESETS}:
            raise InvalidRequest("invalid_range", "days: choose 7, 30 or 90, or give from and to")
        preset = int(days_text) if days_text else DEFAULT_DAYS
        until = today
        since = today - timedelta(days=preset - 1)
    if not bucket:
        bucket = "day" if (until - since).days < 45 else "week"
    return Range(since, until, bucket, preset)


# --- ranking ---------------------------------------------------------------------------------


def wilson(failed: int, runs: int, z: float = Z) -> tuple[float, float] | None:
    """The Wilson score interval of a failure rate (None without runs)."""
    if runs <= 0:
        return None
    failed = max(0, min(failed, runs))
    p = failed / runs
    denominator = 1 + z * z / runs
    centre = p + z * z / (2 * runs)
    margin = z * math.sqrt(p * (1 - p) / runs + z * z / (4 * runs * runs))
    return max(0.0, (centre - margin) / denominator), min(1.0, (centre + margin) / denominator)


def risk(failed: int, runs: int) -> dict[str, Any]:
    """What the ranking shows of an agent: its rate, the interval, and whether it has the volume to rank."""
    interval = wilson(failed, runs)
    return {
        "rate": round(failed / runs, 4) if runs else None,
        "low": round(interval[0], 4) if interval else None,
        "high": round(interval[1], 4) if interval else None,
        "enough": runs >= MIN_RUNS,
    }


def rank_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """Agents with enough runs first, by the lower bound (highest first); then the rest, the same
    way; agents without runs last; ties by volume (more runs first), then name."""
    low = row["low"]
    return (not row["enough"], low is None, -(low or 0.0), -row["runs"], row["name"])


# --- buckets ---------------------------------------------------------------------------------


def bucket_start(day: date, bucket: str) -> date:
    return day - timedelta(days=day.weekday()) if bucket == "week" else day


def buckets(period: Range) -> list[dict[str, Any]]:
    """Every bucket of the range, empty ones too, oldest first: its first and last day in the range."""
    out = []
    day = period.since
    while day <= period.until:
        start = bucket_start(day, period.bucket)
        length = 6 if period.bucket == "week" else 0
        end = start + timedelta(days=min(length, (period.until - start).days))  # never past the range (nor date.max)
        out.append({"start": day, "end": end, "partial": period.bucket == "week" and (day != start or (end - start).days < 6)})
        if end >= period.until:
            break
        day = end + timedelta(days=1)
    return out


# --- durations -------------------------------------------------------------------------------


def bin_seconds(bin_: int) -> float:
    """The geometric middle of a duration bin, in seconds."""
    return BIN_BASE ** (bin_ + 0.5) / 1000


def percentiles(bins: Mapping[int, int], qs: Iterable[float] = (0.5, 0.95)) -> dict[str, float | None]:
    """Nearest-rank percentiles read from a histogram of duration bins (each within 5 % of the truth)."""
    total = sum(bins.values())
    out: dict[str, float | None] = {}
    ordered = sorted(bins.items())
    for q in qs:
        key = f"p{round(q * 100)}"
        if not total:
            out[key] = None
            continue
        rank = max(1, math.ceil(q * total))
        seen = 0
        for b, n in ordered:
            seen += n
            if seen >= rank:
                out[key] = round(bin_seconds(b), 3)
                break
    return out


# --- statements ------------------------------------------------------------------------------


def _where(
    agent: str | None, version: int | None, workspace_ids: list[int] | None, period: Range, column: str = "day"
) -> tuple[str, list[Any]]:
    clauses = [f"{column} >= %s", f"{column} <= %s"]
    params: list[Any] = [period.since, period.until]
    if agent is not None:
        clauses.insert(0, "agent_name = %s")
        params.insert(0, agent)
    if version is not None:
        clauses.append("agent_version = %s")
        params.append(version)
    if workspace_ids is not None:
        clauses.append("workspace_id = ANY(%s)")
        params.append(list(workspace_ids))
    return " AND ".join(clauses), params


def _bucket_sql(period: Range) -> tuple[str, list[Any]]:
    """The first day of a row's bucket in the range, in SQL: its day, or its week's Monday (the
    range's first day when the range starts mid-week)."""
    if period.bucket == "week":
        # Date arithmetic only (2000-01-03 was a Monday): an extract() per row costs more than the scan.
        return "GREATEST(%s::date, day - (((day - DATE '2000-01-03') %% 7 + 7) %% 7))", [period.since]
    return "day", []


def whole_weeks(period: Range) -> tuple[date, date] | None:
    """The first Monday and the last Sunday of the weeks wholly inside the range (None: none are)."""
    first = period.since + timedelta(days=(7 - period.since.weekday()) % 7)
    last = period.until - timedelta(days=(period.until.weekday() + 1) % 7)
    return (first, last) if first < last else None


def _durations_statement(agent: str, version: int | None, workspace_ids: list[int] | None, period: Range) -> Statement:
    """Durations per version, bucket and bin. In weekly buckets, the whole weeks come from the weekly
    rows and only the days the range cuts from the daily ones (both are kept by the same trigger)."""
    where, params = _where(agent, version, workspace_ids, period)
    bucket, bucket_params = _bucket_sql(period)
    weeks = whole_weeks(period) if period.bucket == "week" else None
    if weeks is None:
        return (
            "durations",
            f"SELECT agent_version, {bucket}, bin, sum(runs), sum(seconds) FROM insights_durationdaily WHERE {where} "
            "GROUP BY 1, 2, 3",
            bucket_params + params,
        )
    mondays = Range(weeks[0], weeks[1] - timedelta(days=6), "week", None)
    weekly_where, weekly_params = _where(agent, version, workspace_ids, mondays, column="week")
    return (
        "durations",
        f"SELECT agent_version, week, bin, sum(runs), sum(seconds) FROM insights_durationweekly "
        f"WHERE {weekly_where} GROUP BY 1, 2, 3 "
        f"UNION ALL SELECT agent_version, {bucket}, bin, sum(runs), sum(seconds) FROM insights_durationdaily "
        f"WHERE {where} AND NOT (day >= %s AND day <= %s) GROUP BY 1, 2, 3",
        weekly_params + bucket_params + params + [weeks[0], weeks[1]],
    )


def agent_statements(
    agent: str, period: Range, *, version: int | None = None, workspace_ids: list[int] | None = None
) -> list[Statement]:
    """An agent's numbers in a range, per version and bucket: runs, failures, usage and durations
    (each a grouped read of one rollup's covering index over the agent's days)."""
    where, params = _where(agent, version, workspace_ids, period)
    bucket, bucket_params = _bucket_sql(period)
    p = bucket_params + params
    return [
        ("runs", f"SELECT agent_version, {bucket}, sum(started) FROM insights_rundaily WHERE {where} GROUP BY 1, 2", p),
        ("failed", f"SELECT agent_version, {bucket}, sum(failed) FROM insights_failuredaily WHERE {where} GROUP BY 1, 2", p),
        (
            "usage",
            f"SELECT agent_version, {bucket}, route, sum(calls), sum(input_tokens), sum(output_tokens) "
            f"FROM insights_usagedaily WHERE {where} GROUP BY 1, 2, 3",
            p,
        ),
        _durations_statement(agent, version, workspace_ids, period),
    ]


def workspace_statements(workspace_id: int, period: Range) -> list[Statement]:
    """Every agent's usage and durations in a workspace and range (the Agents page counts its runs
    and failures itself, insights.overview)."""
    where, params = _where(None, None, [workspace_id], period)
    return [
        (
            "usage",
            "SELECT agent_name, route, sum(calls), sum(input_tokens), sum(output_tokens) "
            f"FROM insights_usagedaily WHERE {where} GROUP BY 1, 2",
            params,
        ),
        ("durations", f"SELECT agent_name, bin, sum(runs) FROM insights_durationdaily WHERE {where} GROUP BY 1, 2", params),
    ]


def _execute(statements: list[Statement]) -> dict[str, list[tuple[Any, ...]]]:
    results = {}
    with connection.cursor() as cursor:
        for name, sql, params in statements:
            cursor.execute(sql, params)
            results[name] = cursor.fetchall()
    return results


UNIT = 100_000  # tokens priced to find a model's rate (below the context sizes where tiered prices rise)


@lru_cache(maxsize=1024)
def _rates(model: str, provider: str | None) -> tuple[Decimal, Decimal] | None:
    """Dollars per input and per output token of a model, or None when genai-prices does not know it."""
    per_input = price(model, provider, UNIT, 0)
    per_output = price(model, provider, 0, UNIT)
    if per_input is None or per_output is None:
        return None
    return per_input / UNIT, per_output / UNIT


def _usage(rows: Iterable[tuple[str, int, int, int]]) -> dict[str, Any]:
    """Tokens and cost of (route, calls, input, output) rows. A bucket's cost is its tokens at the
    model's per-token rate (one price lookup per model, not per bucket: a lookup takes milliseconds)."""
    total = {"input_tokens": 0, "output_tokens": 0, "calls": 0}
    cost, priced, unpriced = Decimal(0), False, set()
    for route, calls, input_tokens, output_tokens in rows:
        total["calls"] += int(calls)
        total["input_tokens"] += int(input_tokens)
        total["output_tokens"] += int(output_tokens)
        model, provider = model_of({"route": route})
        rates = _rates(model, provider) if model else None
        if rates is None:
            unpriced.add(model or "unknown")
            continue
        cost += rates[0] * int(input_tokens) + rates[1] * int(output_tokens)
        priced = True
    return {**total, "cost_usd": str(cost.quantize(CENT_DIGITS)) if priced else None, "unpriced_models": sorted(unpriced)}


# --- documents -------------------------------------------------------------------------------


def _measures(runs: int, failed: int, usage: dict[str, Any], bins: Mapping[int, int], seconds: float) -> dict[str, Any]:
    finished = sum(bins.values())
    return {
        "runs": runs,
        "failed": failed,
        **risk(failed, runs),
        "tokens": usage["input_tokens"] + usage["output_tokens"],
        "input_tokens": usage["input_tokens"],
        "output_tokens": usage["output_tokens"],
        "calls": usage["calls"],
        "cost_usd": usage["cost_usd"],
        "unpriced_models": usage["unpriced_models"],
        "finished": finished,
        **percentiles(bins),
        "mean_seconds": round(seconds / finished, 3) if finished else None,
    }


class _Acc:
    """The sums behind one set of measures (all, a version, a bucket)."""

    __slots__ = ("runs", "failed", "usage", "bins", "seconds")

    def __init__(self) -> None:
        self.runs = 0
        self.failed = 0
        self.usage: dict[str, list[int]] = {}
        self.bins: dict[int, int] = {}
        self.seconds = 0.0

    def measures(self) -> dict[str, Any]:
        rows = ((route, c, i, o) for route, (c, i, o) in self.usage.items())
        return _measures(self.runs, self.failed, _usage(rows), self.bins, self.seconds)


def build_agent_numbers(period: Range, results: Mapping[str, list[tuple[Any, ...]]]) -> dict[str, Any]:
    """An agent's measures in all, per version (newest first) and per bucket (oldest first, empty
    ones too). The rows are keyed by (version, first day of the bucket); one pass over them."""
    spans = buckets(period)
    by_start = {b["start"]: _Acc() for b in spans}
    total = _Acc()
    versions: dict[int, _Acc] = {}

    def targets(v: Any, start: date) -> list[_Acc]:
        found = [total, versions.setdefault(int(v), _Acc())]
        if start in by_start:
            found.append(by_start[start])
        return found

    for v, start, n in results["runs"]:
        for acc in targets(v, start):
            acc.runs += int(n)
    for v, start, n in results["failed"]:
        for acc in targets(v, start):
            acc.failed += int(n)
    for v, start, route, calls, i, o in results["usage"]:
        for acc in targets(v, start):
            sums = acc.usage.setdefault(route, [0, 0, 0])
            sums[0] += int(calls)
            sums[1] += int(i)
            sums[2] += int(o)
    for v, start, b, n, sec in results["durations"]:
        for acc in targets(v, start):
            acc.bins[int(b)] = acc.bins.get(int(b), 0) + int(n)
            acc.seconds += float(sec)
    trend = [
        {"start": b["start"].isoformat(), "end": b["end"].isoformat(), "partial": b["partial"], **by_start[b["start"]].measures()}
        for b in spans
    ]
    return {
        "range": _range_doc(period),
        **total.measures(),
        "versions": [{"version": v or None, **acc.measures()} for v, acc in sorted(versions.items(), reverse=True)],
        "trend": trend,
    }


def agent_numbers(
    agent: str, period: Range, *, version: int | None = None, workspace_ids: list[int] | None = None
) -> dict[str, Any]:
    return build_agent_numbers(period, _execute(agent_statements(agent, period, version=version, workspace_ids=workspace_ids)))


EMPTY_USAGE: dict[str, Any] = {
    "tokens": 0,
    "input_tokens": 0,
    "output_tokens": 0,
    "calls": 0,
    "cost_usd": None,
    "unpriced_models": [],
    "finished": 0,
    "p50": None,
    "p95": None,
}


def workspace_usage(workspace_id: int, period: Range) -> dict[str, dict[str, Any]]:
    """Per agent of the workspace: its tokens, cost and duration percentiles in the range."""
    results = _execute(workspace_statements(workspace_id, period))
    usage: dict[str, list[tuple[str, int, int, int]]] = {}
    for name, route, calls, i, o in results["usage"]:
        usage.setdefault(name, []).append((route, int(calls), int(i), int(o)))
    bins: dict[str, dict[int, int]] = {}
    for name, b, n in results["durations"]:
        bins.setdefault(name, {})[int(b)] = int(n)
    out = {}
    for name in (set(usage) | set(bins)) - {""}:
        cost = _usage(usage.get(name, []))
        out[name] = {
            **cost,
            "tokens": cost["input_tokens"] + cost["output_tokens"],
            "finished": sum(bins.get(name, {}).values()),
            **percentiles(bins.get(name, {})),
        }
    return out


def _range_doc(period: Range) -> dict[str, Any]:
    return {
        "since": period.since.isoformat(),
        "until": period.until.isoformat(),
        "days": period.days,
        "bucket": period.bucket,
        "preset": period.preset,
        "time_zone": "UTC",
        "week_starts": "Monday",
    }
