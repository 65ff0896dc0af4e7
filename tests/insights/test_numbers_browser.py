"""A manager's numbers in headless Chromium: the Agents page ranked with its volume, a range picked
and a bad one refused in words, then the scorecard's bars with their values, one colour per meaning."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest

from insights import numbers
from insights.models import DurationDaily, DurationWeekly, FailureDaily, RunDaily, UsageDaily
from tests.conftest import Team
from tests.insights.planting import make_agent

# Committed data (no rollback, no flush), so daphne sees every row: each test makes its own workspace.
pytestmark = [pytest.mark.browser, pytest.mark.live, pytest.mark.usefixtures("committed")]


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def plant(team: Team, name: str, *, failed: int, runs: int, days_ago: int = 0) -> None:
    """An agent's rollup rows as the triggers would keep them: runs, failures, a model's tokens and durations."""
    make_agent(name, workspace=team.workspace)
    day = numbers.today_utc() - timedelta(days=days_ago)
    ws = team.workspace.pk
    RunDaily.objects.create(agent_name=name, agent_version=1, workspace_id=ws, day=day, started=runs)
    if failed:
        FailureDaily.objects.create(agent_name=name, agent_version=1, workspace_id=ws, kind="not_found", day=day, failed=failed)
    UsageDaily.objects.create(
        agent_name=name,
        agent_version=1,
        workspace_id=ws,
        route="openai:gpt-4o",
        day=day,
        calls=runs,
        input_tokens=runs * 1000,
        output_tokens=runs * 200,
    )
    week = day - timedelta(days=day.weekday())
    for bin_, n in ((73, runs - 1), (97, 1)):  # about 1 s, and one run of about 10 s
        DurationDaily.objects.create(agent_name=name, agent_version=1, workspace_id=ws, day=day, bin=bin_, runs=n, seconds=n)
        DurationWeekly.objects.create(agent_name=name, agent_version=1, workspace_id=ws, week=week, bin=bin_, runs=n, seconds=n)


@pytest.mark.spec("F18")
def test_a_manager_ranks_agents_picks_a_range_and_reads_the_bars(live_team: Team, browsers: Any) -> None:
    tag = uuid.uuid4().hex[:6]
    steady, unlucky = f"steady-{tag}", f"unlucky-{tag}"
    plant(live_team, steady, failed=100, runs=1000)  # 10 % of a thousand
    plant(live_team, unlucky, failed=2, runs=2)  # 100 % of two
    manager = browsers()
    manager.sign_in(live_team.users["viewer"].username)
    page = manager.open(f"/w/{live_team.slug}/agents/")

    names = page.locator("tr.agent-row a.agent-name")
    expect(names).to_have_text([steady, unlucky])  # the volume-aware rank: 10 % of 1000 before 2 of 2
    steady_row = page.locator("tr.agent-row", has=page.get_by_role("link", name=steady, exact=True))
    expect(steady_row.locator(".volume-value")).to_have_text("1000")
    expect(page.locator("tr.agent-row", has=page.get_by_role("link", name=unlucky, exact=True))).to_contain_text("few runs")
    manager.shot("numbers-agents")

    page.get_by_role("link", name="7 days").click()
    page.wait_for_url("**days=7**")
    expect(page.get_by_role("link", name="7 days")).to_have_attribute("aria-current", "true")
    expect(names).to_have_count(2)

    page.fill("input[name=from]", "2026-11-20")
    page.fill("input[name=to]", "2026-11-10")
    page.get_by_role("button", name="Show").click()
    expect(page.get_by_role("alert")).to_contain_text("from (2026-11-20) is after to (2026-11-10)")
    expect(names).to_have_count(2)  # the default range still shows

    page.goto(f"{manager.server.url}/w/{live_team.slug}/agents/{steady}/?days=7")
    volume = page.locator("svg.chart.bars.m-runs")
    expect(volume).to_be_visible()
    expect(volume.locator("text.value")).to_have_text(["1k"])  # today's bar carries its value
    today_bar = volume.locator("g.bucket").last.locator("rect.col").first.bounding_box()
    chart = volume.bounding_box()
    assert today_bar and chart and today_bar["height"] > chart["height"] * 0.5, (today_bar, chart)  # drawn to scale
    expect(page.locator("dd.m-duration-ink")).to_contain_text("/")
    expect(page.locator("dd.m-tokens-ink")).to_have_text("1.2M")
    colours = page.evaluate(
        """() => Object.fromEntries(['m-runs', 'm-failed', 'm-tokens', 'm-cost', 'm-duration'].map(
             m => [m, getComputedStyle(document.querySelector('svg.chart.bars.' + m + ' .col')).fill]))"""
    )
    assert len(set(colours.values())) == 5, colours  # one colour per meaning
    manager.shot("numbers-scorecard")
    assert not [e for e in manager.errors if "Content Security Policy" in e], manager.errors
