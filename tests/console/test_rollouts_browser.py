"""The Agents page's Rollouts section in headless Chromium against daphne: an operator sees a
canary beside its stable version and rolls it back with one button (the confirm accepted); a
viewer sees the same numbers without the buttons."""

from __future__ import annotations

from typing import Any

import pytest

from oz0agents.models import Agent, RolloutEvent
from tests.agents.test_rollouts import rolling, runs_of
from tests.conftest import Team
from tests.console.test_browser import expect, no_csp_violations

pytestmark = [pytest.mark.browser, pytest.mark.live, pytest.mark.usefixtures("committed", "no_dispatch")]


def test_an_operator_rolls_a_canary_back_from_the_agents_page_and_a_viewer_only_reads(browsers: Any) -> None:
    team = Team()
    agent = rolling(team, percent=20)
    runs_of(agent, "canary", completed=1, failed=3, kind="not_found")
    runs_of(agent, "stable", completed=6)

    viewer = browsers()
    viewer.sign_in(team.users["viewer"].username)
    seen = viewer.open(f"/w/{team.slug}/agents/")
    section = seen.locator(f'#rollouts [data-agent="{agent.name}"]')
    expect(section).to_contain_text("canary v2 on 20 % of new runs beside stable v1")
    expect(section.locator(".arm-canary .arm-failed")).to_have_text("3")
    expect(section.locator(".arm-stable .arm-runs")).to_have_text("6")
    expect(section.locator('button[data-verb="rollback"]')).to_have_count(0)

    operator = browsers()
    operator.sign_in(team.users["operator"].username)
    page = operator.open(f"/w/{team.slug}/agents/")
    expect(page.locator(f'#rollouts [data-agent="{agent.name}"] .arm-canary .arm-rate')).to_have_text("75%")
    operator.shot("rollouts")
    page.locator(f'#rollouts [data-agent="{agent.name}"] button[data-verb="rollback"]').click()
    expect(page.locator("#rollouts")).to_contain_text("No canary under way")
    expect(page.locator("#rollouts .rollout-trail li").first).to_contain_text("rolled back")
    assert Agent.objects.get(pk=agent.pk).canary_version_id is None
    assert RolloutEvent.objects.filter(agent=agent).latest("id").verb == "rolled_back"
    no_csp_violations(operator, viewer)
