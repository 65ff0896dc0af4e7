"""Numbers a manager can trust (issue 31 item 3): a volume-aware rank, a validated date range with
daily or weekly buckets (UTC days, weeks from Monday, empty buckets kept), volume bars with their
values, one colour per meaning, and tokens, cost and run duration (p50, p95) per agent, version and
bucket — read from the rollups the triggers keep, for every role that may see the page, never words."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.db.models import Sum
from django.test import Client
from django.utils import timezone

from insights import charts, numbers, overview
from insights.models import DurationDaily, DurationWeekly, FailureDaily, RunDaily, UsageDaily
from runs.kernel import InvalidRequest
from runs.models import Run, TraceEvent
from tests.conftest import Team
from tests.insights.conftest import answering_round, oz_fail_round, run_agent
from tests.insights.planting import make_agent

SECRET = "SECRETWORDSOFAFAILURE"
TODAY = date(2026, 11, 18)  # a Wednesday
ROOT = Path(__file__).resolve().parents[2]


def client_for(team: Team, role: str) -> Client:
    client = Client()
    client.force_login(team.users[role])
    return client


# --- the rank at its edges ----------------------------------------------------------------------


def test_the_wilson_bound_at_its_edges() -> None:
    assert numbers.wilson(0, 0) is None and numbers.risk(0, 0) == {"rate": None, "low": None, "high": None, "enough": False}
    low, high = numbers.wilson(1, 1) or (0, 0)
    assert round(low, 4) == 0.2065 and high == 1.0  # one failed run: at least 21 %, not 100 %
    low, high = numbers.wilson(0, 1) or (0, 0)
    assert low == 0.0 and round(high, 4) == 0.7935
    low, _ = numbers.wilson(50, 50) or (0, 0)
    assert 0.92 < low < 0.93  # all failed, with volume: at least 93 %
    low, high = numbers.wilson(100, 1000) or (0, 0)
    assert 0.08 < low < 0.1 < high < 0.125
    assert numbers.wilson(7, 3) == numbers.wilson(3, 3)  # more failures than runs (days cut apart): capped


def ranked(rows: dict[str, tuple[int, int]]) -> list[str]:
    docs = [{"name": name, "runs": runs, **numbers.risk(failed, runs)} for name, (failed, runs) in rows.items()]
    return [d["name"] for d in sorted(docs, key=numbers.rank_key)]


@pytest.mark.spec("F18")
def test_a_low_volume_total_failure_ranks_after_a_high_volume_ten_percent() -> None:
    order = ranked(
        {
            "never-ran": (0, 0),
            "one-run-failed": (1, 1),
            "five-of-five": (5, 5),
            "ten-percent-of-1000": (100, 1000),
            "clean-50": (0, 50),
            "all-failed-20": (20, 20),
        }
    )
    # With the volume to rank: all failed first, then 10 %, then none; below MIN_RUNS after them
    # (five of five before one of one: its bound is higher); no runs last.
    assert order == ["all-failed-20", "ten-percent-of-1000", "clean-50", "five-of-five", "one-run-failed", "never-ran"]


def test_the_raw_rate_would_rank_them_the_other_way() -> None:
    """Why the rank exists: by the raw rate one failed run outranks a thousand runs at 30 %."""
    assert ranked({"one": (1, 1), "steady": (300, 1000)}) == ["steady", "one"]
    assert numbers.risk(1, 1)["rate"] == 1.0 > numbers.risk(300, 1000)["rate"]


def plant_rollups(team: Team, name: str, failed: int, runs: int, day: date) -> None:
    make_agent(name, workspace=team.workspace)
    if runs:
        RunDaily.objects.create(agent_name=name, agent_version=1, workspace_id=team.workspace.pk, day=day, started=runs)
    if failed:
        FailureDaily.objects.create(
            agent_name=name, agent_version=1, workspace_id=team.workspace.pk, kind="not_found", day=day, failed=failed
        )


@pytest.mark.django_db
@pytest.mark.spec("F18")
def test_the_agents_page_ranks_by_the_bound_and_shows_the_volume(team: Team) -> None:
    today = numbers.today_utc()
    plant_rollups(team, "low-volume-all-failed", 2, 2, today)
    plant_rollups(team, "high-volume-ten-percent", 100, 1000, today)
    plant_rollups(team, "one-failed-run", 1, 1, today)
    plant_rollups(team, "no-runs", 0, 0, today)
    html = client_for(team, "viewer").get(f"/w/{team.slug}/agents/").content.decode()
    names = re.findall(r'<a class="agent-name" href="[^"]+">([^<]+)</a>', html)
    assert names == ["high-volume-ten-percent", "low-volume-all-failed", "one-failed-run", "no-runs"]
    row = re.search(r'<tr class="agent-row">.*?high-volume-ten-percent.*?</tr>', html, re.S)
    assert row and '<span class="volume-value">1000</span>' in row.group(0)
    assert ">8.3%" in row.group(0) and "few runs" not in row.group(0)  # the bound of 100 / 1000 (8.26 %)
    low = re.search(r'<tr class="agent-row">.*?low-volume-all-failed.*?</tr>', html, re.S)
    assert low and "few runs" in low.group(0) and '<span class="volume-value">2</span>' in low.group(0)
    # The other sorts stay: by raw rate the low-volume agents lead.
    by_rate = client_for(team, "viewer").get(f"/w/{team.slug}/agents/", {"sort": "rate"}).content.decode()
    assert re.findall(r'<a class="agent-name" href="[^"]+">([^<]+)</a>', by_rate)[0] in (
        "low-volume-all-failed",
        "one-failed-run",
    )


# --- the range ------------------------------------------------------------------------------------


def test_presets_and_custom_ranges() -> None:
    week = numbers.parse_range({"days": "7"}, TODAY)
    assert (week.since, week.until, week.bucket, week.preset) == (date(2026, 11, 12), TODAY, "day", 7)
    assert numbers.parse_range({}, TODAY).days == 30
    quarter = numbers.parse_range({"days": "90"}, TODAY)
    assert quarter.days == 90 and quarter.bucket == "week"  # long ranges default to weeks
    assert numbers.parse_range({"days": "90", "bucket": "day"}, TODAY).bucket == "day"
    custom = numbers.parse_range({"from": "2026-01-01", "to": "2026-01-31", "bucket": "week"}, TODAY)
    assert (custom.since, custom.until, custom.preset, custom.bucket) == (date(2026, 1, 1), date(2026, 1, 31), None, "week")
    assert custom.query() == {"from": "2026-01-01", "to": "2026-01-31", "bucket": "week"}
    assert numbers.parse_range({"from": "2026-11-01", "to": "2027-06-01"}, TODAY).until == TODAY  # no future
    assert numbers.parse_range({"to": "2026-06-30"}, TODAY).since == date(2026, 6, 1)
    assert numbers.parse_range({"from": "2026-11-18"}, TODAY).days == 1
    full = numbers.parse_range({"from": "2025-11-18", "to": "2026-11-18"}, TODAY)
    assert full.days == numbers.MAX_DAYS


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"from": "yesterday"}, "from: give a day as YYYY-MM-DD"),
        ({"from": "2026-13-01"}, "from: 2026-13-01 is not a day of the calendar"),
        ({"to": "2026-02-30"}, "to: 2026-02-30 is not a day of the calendar"),
        ({"from": "2026-1-5"}, "from: give a day as YYYY-MM-DD"),
        ({"from": "2026-11-10", "to": "2026-11-01"}, "from (2026-11-10) is after to (2026-11-01)"),
        ({"from": "2020-01-01", "to": "2026-01-01"}, "a range is at most 366 days"),
        ({"days": "14"}, "days: choose 7, 30 or 90"),
        ({"days": "-7"}, "days: choose 7, 30 or 90"),
        ({"days": "7", "from": "2026-11-01"}, "give either days or from/to, not both"),
        ({"bucket": "month"}, "bucket: choose day or week"),
        ({"from": "9" * 10_000}, "from: give a day as YYYY-MM-DD"),
        ({"from": "０２０２６-01-01"}, "from: give a day as YYYY-MM-DD"),  # full-width digits
        ({"from": "0000-01-01"}, "from: 0000-01-01 is not a day of the calendar"),
    ],
)
def test_bad_range_parameters_say_what_to_give(params: dict[str, str], says: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        numbers.parse_range(params, TODAY)
    assert raised.value.key == "invalid_range" and says in str(raised.value.detail)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "query",
    [
        {"from": "yesterday"},
        {"from": "2026-13-45"},
        {"from": "2026-11-10", "to": "2026-11-01"},
        {"days": "1000000000000000000000"},
        {"bucket": "<script>alert(1)</script>"},
        {"from": "x" * 50_000},
        {"days": ["7", "30"], "from": "2026-01-01"},
    ],
)
def test_the_pages_answer_bad_ranges_with_a_message_never_a_500(team: Team, query: dict[str, Any]) -> None:
    make_agent("ranged", workspace=team.workspace)
    for path in (f"/w/{team.slug}/agents/", f"/w/{team.slug}/agents/ranged/"):
        page = client_for(team, "viewer").get(path, query)
        assert page.status_code == 200, (path, query)
        html = page.content.decode()
        assert 'class="error range-error" role="alert"' in html and "Showing the last 30 days." in html
        assert "<script>alert(1)</script>" not in html


@pytest.mark.django_db
def test_a_nul_in_a_range_parameter_is_a_bad_request(team: Team) -> None:
    make_agent("ranged", workspace=team.workspace)
    assert client_for(team, "viewer").get(f"/w/{team.slug}/agents/", {"from": "2026\x00"}).status_code == 400


# --- buckets ------------------------------------------------------------------------------------


def test_weeks_start_on_monday_and_the_range_cuts_its_first_and_last() -> None:
    period = numbers.Range(date(2026, 11, 4), date(2026, 11, 17), "week", None)  # Wednesday to Tuesday
    spans = [(b["start"].isoformat(), b["end"].isoformat(), b["partial"]) for b in numbers.buckets(period)]
    assert spans == [
        ("2026-11-04", "2026-11-08", True),
        ("2026-11-09", "2026-11-15", False),
        ("2026-11-16", "2026-11-17", True),
    ]
    monday_to_sunday = numbers.Range(date(2026, 11, 9), date(2026, 11, 22), "week", None)
    assert [b["partial"] for b in numbers.buckets(monday_to_sunday)] == [False, False]
    days = numbers.buckets(numbers.Range(date(2026, 12, 30), date(2027, 1, 2), "day", None))
    assert [b["start"].isoformat() for b in days] == ["2026-12-30", "2026-12-31", "2027-01-01", "2027-01-02"]
    end = numbers.buckets(numbers.Range(date.max - timedelta(days=2), date.max, "week", None))
    assert end[-1]["end"] == date.max  # never steps past the last day there is


def finding_at(team: Team, agent: str, at: datetime, version: int = 1) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO runs_finding (run_id, workspace_id, agent_name, agent_version, kind, retryable, partial, person, "
            "declared, step_key, step_kind, error_key, attempts, created_at, fingerprint) "
            "VALUES (gen_random_uuid(), %s, %s, %s, 'timeout', true, true, false, false, 'r1', 'round', '', 1, %s, '')",
            [team.workspace.pk, agent, version, at],
        )


@pytest.mark.django_db
@pytest.mark.spec("F18")
def test_buckets_are_utc_days_whatever_the_time_zone_and_empty_ones_stay(team: Team, settings: Any) -> None:
    """A failure at 23:30 UTC on Sunday is that week's, one at 00:30 UTC on Monday the next week's,
    with the database session and Django both in a time zone 14 hours ahead of UTC."""
    settings.TIME_ZONE = "Pacific/Kiritimati"
    with connection.cursor() as cursor:
        cursor.execute("SET TIME ZONE 'Pacific/Kiritimati'")
    try:
        with timezone.override("Pacific/Kiritimati"):
            finding_at(team, "tz", datetime(2026, 11, 15, 23, 30, tzinfo=UTC))  # Sunday, UTC
            finding_at(team, "tz", datetime(2026, 11, 16, 0, 30, tzinfo=UTC))  # Monday, UTC
            finding_at(team, "tz", datetime(2026, 11, 16, 0, 45, tzinfo=UTC))
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET TIME ZONE 'UTC'")
    period = numbers.Range(date(2026, 11, 2), date(2026, 11, 22), "week", None)
    doc = numbers.agent_numbers("tz", period, workspace_ids=[team.workspace.pk])
    assert [(b["start"], b["failed"]) for b in doc["trend"]] == [("2026-11-02", 0), ("2026-11-09", 1), ("2026-11-16", 2)]
    daily = numbers.agent_numbers("tz", numbers.Range(date(2026, 11, 14), date(2026, 11, 17), "day", None))
    assert [b["failed"] for b in daily["trend"]] == [0, 1, 2, 0]  # the empty days are there, as zeros
    assert daily["trend"][0]["rate"] is None and daily["trend"][0]["p50"] is None  # nothing to rate: no made-up zero


# --- tokens, cost and durations -----------------------------------------------------------------


def finished_run(team: Team, agent: str, seconds: float, finished: datetime) -> Run:
    """A run row that took `seconds`, finished at `finished`: its finish is counted by the trigger on the update."""
    run = Run.objects.create(workspace=team.workspace, agent_name=agent, status="running")
    Run.objects.filter(pk=run.pk).update(created_at=finished - timedelta(seconds=seconds))
    Run.objects.filter(pk=run.pk).update(finished_at=finished, status="completed")
    return run


@pytest.mark.django_db
@pytest.mark.spec("F18")
def test_durations_p50_and_p95_come_from_the_bins_within_five_percent(team: Team) -> None:
    day = datetime(2026, 11, 10, 12, tzinfo=UTC)
    for _ in range(18):
        finished_run(team, "timed", 2.0, day)
    finished_run(team, "timed", 60.0, day)
    finished_run(team, "timed", 600.0, day)
    run = finished_run(team, "timed", 0.0005, day)  # under a millisecond: the first bin
    Run.objects.filter(pk=run.pk).update(status="completed")  # an update that does not finish it again
    assert DurationDaily.objects.filter(agent_name="timed").aggregate(n=Sum("runs"))["n"] == 21
    doc = numbers.agent_numbers("timed", numbers.Range(date(2026, 11, 9), date(2026, 11, 15), "week", None))
    assert doc["finished"] == 21
    assert abs(doc["p50"] - 2.0) / 2.0 <= 0.05
    assert abs(doc["p95"] - 60.0) / 60.0 <= 0.05
    assert doc["trend"][0]["p50"] == doc["p50"]
    assert abs(doc["mean_seconds"] - (18 * 2 + 60 + 600) / 21) < 0.01


@pytest.mark.django_db
@pytest.mark.spec("F18")
def test_tokens_and_cost_per_version_and_bucket_follow_the_calls(team: Team) -> None:
    make_agent("spender", workspace=team.workspace)
    first = run_agent(team, "spender", answering_round())
    second = run_agent(team, "spender", answering_round())
    # The scripted rounds' own model calls (route "script") count too: what they used before ours.
    scripted = numbers.agent_numbers("spender", numbers.parse_range({"days": "7"}), workspace_ids=[team.workspace.pk])
    for run, route, tokens in ((first, "openai:gpt-4o", (1000, 500)), (second, "script", (7, 3))):
        TraceEvent.objects.create(
            run=run,
            seq=10_000,
            event="provider_call",
            data={"route": route, "usage": {"input_tokens": tokens[0], "output_tokens": tokens[1]}},
        )
    today = numbers.today_utc()
    assert set(UsageDaily.objects.filter(agent_name="spender", day=today).values_list("route", flat=True)) == {
        "openai:gpt-4o",
        "script",
    }
    doc = numbers.agent_numbers("spender", numbers.parse_range({"days": "7"}), workspace_ids=[team.workspace.pk])
    assert doc["tokens"] == 1510 + scripted["tokens"] and doc["input_tokens"] == 1007 + scripted["input_tokens"]
    assert doc["calls"] == 2 + scripted["calls"]
    assert doc["cost_usd"] == "0.007500" and doc["unpriced_models"] == ["script"]  # 1000 in + 500 out on gpt-4o
    assert doc["trend"][-1]["tokens"] == doc["tokens"] and all(b["tokens"] == 0 for b in doc["trend"][:-1])
    assert [v["version"] for v in doc["versions"]] == [1] and doc["versions"][0]["runs"] == 2
    assert doc["finished"] == 2 and doc["p50"] is not None  # the driven runs finished: their durations counted
    # Another workspace's reader of the same agent name sees none of it.
    assert numbers.agent_numbers("spender", numbers.parse_range({}), workspace_ids=[0])["tokens"] == 0


def test_a_version_and_a_bucket_sum_the_same_rows() -> None:
    period = numbers.Range(date(2026, 11, 9), date(2026, 11, 11), "day", None)
    d1, d2 = date(2026, 11, 9), date(2026, 11, 11)
    doc = numbers.build_agent_numbers(
        period,
        {
            "runs": [(1, d1, 10), (2, d1, 5), (2, d2, 5)],
            "failed": [(1, d1, 1), (2, d2, 5)],
            "usage": [(2, d2, "script", 1, 10, 20)],
            "durations": [(1, d1, 50, 10, 1.0), (2, d2, 60, 5, 2.0)],
        },
    )
    assert (doc["runs"], doc["failed"]) == (20, 6)
    assert [(v["version"], v["runs"], v["failed"], v["tokens"]) for v in doc["versions"]] == [(2, 10, 5, 30), (1, 10, 1, 0)]
    assert [(b["start"], b["runs"], b["failed"]) for b in doc["trend"]] == [
        ("2026-11-09", 15, 1),
        ("2026-11-10", 0, 0),
        ("2026-11-11", 5, 5),
    ]
    assert doc["range"] | {} == {
        "since": "2026-11-09",
        "until": "2026-11-11",
        "days": 3,
        "bucket": "day",
        "preset": None,
        "time_zone": "UTC",
        "week_starts": "Monday",
    }


# --- the page: bars with values, one colour per meaning, the role matrix --------------------------


@pytest.fixture
def ranged(team: Team) -> Team:
    make_agent("ranged", workspace=team.workspace, kinds=("not_found",))
    run_agent(team, "ranged", oz_fail_round("not_found", SECRET))
    run_agent(team, "ranged", answering_round())
    run_agent(team, "ranged", answering_round())
    return team


@pytest.mark.django_db
@pytest.mark.spec("F18", "F11", "F12")
def test_the_role_matrix_outsiders_404_viewers_see_counts_never_words(ranged: Team) -> None:
    for path in (f"/w/{ranged.slug}/agents/?days=7", f"/w/{ranged.slug}/agents/ranged/?days=7&bucket=day"):
        assert Client().get(path).status_code == 302
        assert client_for(ranged, "outsider").get(path).status_code == 404
        for role in ("viewer", "reader", "operator"):
            page = client_for(ranged, role).get(path)
            assert page.status_code == 200, (role, path)
            html = page.content.decode()
            assert "not_found" in html, role  # kinds and counts for all
            assert SECRET not in html, role  # words for none on these pages
    outsider = client_for(ranged, "outsider")
    assert outsider.get(f"/w/{ranged.slug}/agents/", {"from": "nonsense"}).status_code == 404  # 404 before validation


@pytest.mark.django_db
@pytest.mark.spec("F18")
def test_the_scorecard_draws_volume_bars_with_their_values(ranged: Team) -> None:
    html = client_for(ranged, "viewer").get(f"/w/{ranged.slug}/agents/ranged/", {"days": "7"}).content.decode()
    volume = re.search(r'<svg class="chart bars m-runs"[^>]*aria-label="runs and failed runs per bucket".*?</svg>', html, re.S)
    assert volume, html
    svg = volume.group(0)
    assert len(re.findall(r'<g class="bucket">', svg)) == 7  # a bar slot for each day, empty ones too
    assert re.findall(r'<text class="value"[^>]*>([^<]+)</text>', svg) == ["3"]  # today's 3 runs, written on the bar
    assert len(re.findall(r'class="col inner m-failed"', svg)) == 1  # the failed one, in front
    assert re.search(r'<dd class="m-runs-ink">3</dd>', html) and re.search(r'<dd class="m-failed-ink">1</dd>', html)
    weekly = client_for(ranged, "viewer").get(f"/w/{ranged.slug}/agents/ranged/", {"days": "90"}).content.decode()
    assert "Runs per week" in weekly
    assert "style=" not in html  # CSP: no inline styles


def css_colours() -> dict[str, str]:
    css = (ROOT / "static" / "css" / "oz0.css").read_text()
    return dict(re.findall(r"\.((?:m|series)-[a-z0-9]+) \{ color: (#[0-9a-f]{6}); \}", css))


def test_one_colour_per_meaning_and_none_shared_with_a_version() -> None:
    colours = css_colours()
    meanings = {f"m-{m}": colours[f"m-{m}"] for m in charts.MEANINGS}
    versions = {k: v for k, v in colours.items() if k.startswith("series-")}
    assert len(set(meanings.values())) == len(meanings), meanings
    assert not set(meanings.values()) & set(versions.values()), (meanings, versions)
    assert len(set(versions.values())) == len(versions) == 6


@pytest.mark.django_db
def test_each_chart_on_the_scorecard_has_one_meaning(ranged: Team) -> None:
    html = client_for(ranged, "viewer").get(f"/w/{ranged.slug}/agents/ranged/").content.decode()
    classes = re.findall(r'<svg class="chart bars (m-[a-z]+)', html)
    assert classes == ["m-runs", "m-failed", "m-tokens", "m-cost", "m-duration", "m-duration"]
    timeline = re.search(r'<svg class="chart timeline".*?</svg>', html, re.S)
    assert timeline and set(re.findall(r'<g class="series ([^"]+)">', timeline.group(0))) == {"m-failed"}


@pytest.mark.django_db
def test_a_range_is_kept_by_the_sort_and_scorecard_links(ranged: Team) -> None:
    html = (
        client_for(ranged, "viewer").get(f"/w/{ranged.slug}/agents/", {"from": "2026-01-01", "to": "2026-01-31"}).content.decode()
    )
    assert "/agents/ranged/?from=2026-01-01&amp;to=2026-01-31&amp;bucket=day" in html
    assert 'href="?sort=runs&amp;from=2026-01-01&amp;to=2026-01-31&amp;bucket=day"' in html
    assert 'value="2026-01-01"' in html and "no runs in the range" in html  # nothing ran in January
    fragment = client_for(ranged, "viewer").get(
        f"/w/{ranged.slug}/agents/", {"sort": "runs", "days": "7"}, HTTP_HX_REQUEST="true"
    )
    assert "<html" not in fragment.content.decode() and "ranged" in fragment.content.decode()


@pytest.mark.django_db
def test_the_agents_page_reads_a_constant_number_of_queries_in_any_range(team: Team) -> None:
    from django.test.utils import CaptureQueriesContext

    make_agent("one", workspace=team.workspace)
    run_agent(team, "one", oz_fail_round("not_found"))
    viewer = client_for(team, "viewer")
    viewer.get(f"/w/{team.slug}/agents/?days=90")
    with CaptureQueriesContext(connection) as few:
        viewer.get(f"/w/{team.slug}/agents/?days=90")
    for index in range(3):
        make_agent(f"more-{index}", workspace=team.workspace)
        run_agent(team, f"more-{index}", oz_fail_round("not_found"))
    with CaptureQueriesContext(connection) as many:
        viewer.get(f"/w/{team.slug}/agents/?days=90")
    assert len(many) == len(few)
    assert not [q for q in many.captured_queries if "runs_finding" in q["sql"] or "runs_traceevent" in q["sql"]]
    assert len(overview.agents_overview(team.workspace, period=numbers.parse_range({"days": "7"}))) == 4


@pytest.mark.django_db
@pytest.mark.spec("F18")
def test_weekly_buckets_read_whole_weeks_from_the_weekly_rows_and_agree_with_the_days(team: Team) -> None:
    for day, seconds in (((2026, 11, 4), 1.0), ((2026, 11, 9), 2.0), ((2026, 11, 15), 30.0), ((2026, 11, 17), 400.0)):
        finished_run(team, "weekly", seconds, datetime(*day, 12, tzinfo=UTC))
    assert DurationWeekly.objects.filter(agent_name="weekly").count() == 4  # (week, bin) pairs: 11-02, 11-09 (two), 11-16
    period = numbers.Range(date(2026, 11, 4), date(2026, 11, 17), "week", None)  # Wednesday to Tuesday: cut weeks at both ends
    assert numbers.whole_weeks(period) == (date(2026, 11, 9), date(2026, 11, 15))
    assert "insights_durationweekly" in numbers.agent_statements("weekly", period)[3][1]
    weekly = numbers.agent_numbers("weekly", period)
    daily = numbers.agent_numbers("weekly", numbers.Range(period.since, period.until, "day", None))
    assert [b["finished"] for b in weekly["trend"]] == [1, 2, 1]
    assert weekly["finished"] == daily["finished"] == 4 and weekly["p50"] == daily["p50"] and weekly["p95"] == daily["p95"]
    assert abs(weekly["trend"][1]["p95"] - 30.0) / 30 <= 0.05
    short = numbers.Range(date(2026, 11, 4), date(2026, 11, 8), "week", None)  # no whole week: days only
    assert numbers.whole_weeks(short) is None and numbers.agent_numbers("weekly", short)["finished"] == 1


# --- the API ------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.spec("F18", "F11")
def test_the_numbers_api_answers_each_role_and_refuses_bad_ranges_typed(ranged: Team) -> None:
    path = f"/insights/agents/ranged/numbers?days=7&workspace={ranged.slug}"
    for role in ("viewer", "reader", "operator"):
        status, doc = ranged.api(role).get(path)
        assert status == 200, (role, doc)
        assert (doc["runs"], doc["failed"], doc["range"]["days"], len(doc["trend"])) == (3, 1, 7, 7)
        assert SECRET not in str(doc)
    assert ranged.api("outsider").get(path)[0] == 404
    assert ranged.api("outsider").get("/insights/agents/ranged/numbers")[0] == 404  # no workspace of theirs
    assert ranged.api("viewer").get(f"/insights/agents/nobody/numbers?workspace={ranged.slug}")[0] == 404
    weekly = ranged.api("viewer").get("/insights/agents/ranged/numbers?from=2026-01-01&to=2026-03-31&bucket=week")
    assert weekly[0] == 200 and weekly[1]["range"]["bucket"] == "week" and weekly[1]["trend"][0]["partial"] is True
    for query, says in (
        ("from=2026-02-30", "not a day of the calendar"),
        ("from=2026-03-01&to=2026-02-01", "is after to"),
        ("days=8", "days"),
        ("bucket=hour", "bucket"),
        ("from=" + "9" * 41, "from"),
        ("version=0", "version"),
    ):
        status, doc = ranged.api("viewer").get(f"/insights/agents/ranged/numbers?{query}")
        assert status == 400, (query, doc)
        assert doc["error"]["key"] in ("invalid_range", "invalid_query") and says in doc["error"]["detail"], doc
