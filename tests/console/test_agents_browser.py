"""A manager reaches an agent's scorecard from the navigation in two clicks: Agents, then the agent."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from runs import kernel
from runs.models import Run
from tests.conftest import Team, wait_for
from tests.console import states

# Committed data (no rollback, no flush), so the worker and daphne see every row.
pytestmark = [pytest.mark.browser, pytest.mark.live, pytest.mark.usefixtures("committed")]


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def failed_run(team: Team, agent: str) -> Run:
    body = {
        "agent": agent,
        "tasks": [
            {
                "key": "r1",
                "kind": "round",
                "model": "script",
                "prompt": "go",
                "tools": ["oz.fail"],
                "script": [{"oz_fail": {"kind": "not_found", "message": "WORDS-NOT-FOR-VIEWERS"}}],
            }
        ],
    }
    run, _ = kernel.create_run(workspace=team.workspace, user=team.users["operator"], body=body)
    wait_for(lambda: Run.objects.get(pk=run.pk).status in ("canceled", "failed"), message="the run failed")
    return run


@pytest.mark.spec("F18")
def test_a_manager_reaches_a_scorecard_from_the_nav_in_two_clicks(live_team: Team, browsers: Any) -> None:
    name = states.agent(f"nav-{uuid.uuid4().hex[:6]}", live_team.workspace)
    failed_run(live_team, name)
    manager = browsers()
    manager.sign_in(live_team.users["viewer"].username)
    page = manager.open(f"/w/{live_team.slug}/inbox/")

    page.get_by_role("link", name="Agents", exact=True).click()  # one
    expect(page.get_by_role("heading", name="Agents")).to_be_visible()
    row = page.locator("tr.agent-row", has=page.get_by_role("link", name=name, exact=True))
    expect(row).to_contain_text("undeclared 1")  # the agent declares no kinds: oz.fail(not_found) is undeclared
    expect(row.locator("svg.spark rect.spark-bar")).to_have_count(1)
    manager.shot("agents")

    row.get_by_role("link", name=name, exact=True).click()  # two
    expect(page.get_by_role("heading", name=name)).to_be_visible()
    expect(page.locator("svg.chart.timeline")).to_be_visible()
    assert page.url.endswith(f"/w/{live_team.slug}/agents/{name}/")
    assert "WORDS-NOT-FOR-VIEWERS" not in page.content()
    assert not [e for e in manager.errors if "Content Security Policy" in e], manager.errors
