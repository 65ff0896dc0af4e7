"""Regression cases in a browser (issue 31 item 5): an operator keeps two failed runs from their
run pages, registers a version that fixes one, runs the cases against it from the Regression
cases page, and the page fills in as the live worker ends the runs: one passed, one failed again."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from evals.models import RegressionCase
from runs import kernel
from runs.models import Run
from tests.conftest import Team, wait_for
from tests.evals.cases import FAILS_ALWAYS, FIXED_BY_V2, register_version, scripted_agent

pytestmark = pytest.mark.browser


def failed(team: Team, agent: str, script: list[Any]) -> Run:
    body = {
        "agent": agent,
        "input": {"issue": "SECRET-INPUT"},
        "tasks": [{"key": "r1", "kind": "round", "model": "script", "prompt": "Triage.", "script": script}],
    }
    run, _ = kernel.create_run(workspace=team.workspace, user=team.users["operator"], body=body)
    return wait_for(lambda: Run.objects.filter(pk=run.pk, failure__isnull=False).first(), message="the run to fail")


def test_an_operator_keeps_failed_runs_and_runs_them_against_a_fixed_version(live_team: Team, browsers: Any) -> None:
    agent = scripted_agent(live_team)
    runs = [failed(live_team, agent, FIXED_BY_V2), failed(live_team, agent, FAILS_ALWAYS)]

    operator = browsers()
    operator.sign_in(live_team.users["operator"].username)
    for run in runs:
        page = operator.open(f"/runs/{run.pk}/", live=False)
        page.get_by_role("button", name="Keep as a regression case").click()
        expect(page.locator("#toasts [role=status]").first).to_contain_text("Kept as regression case")
    assert RegressionCase.objects.filter(agent_name=agent).count() == 2

    register_version(live_team, agent, "oz.fail, test.echo")
    page = operator.open(f"/w/{live_team.slug}/regression-cases/", live=False)
    section = page.locator(f"#agent-{agent}")
    expect(section.locator("tbody tr")).to_have_count(2)
    expect(section).to_contain_text("SECRET-INPUT")
    section.locator("select[name=version]").select_option("2")
    section.get_by_role("button", name="Run against this version").click()
    expect(page.locator("#regression-cases [role=status]")).to_contain_text(f"{agent} v2")
    # The page refreshes itself while the eval's runs are going; the live worker ends them.
    expect(section.locator('td[data-version="2"][data-verdict="passed"]')).to_have_count(1, timeout=30_000)
    expect(section.locator('td[data-version="2"][data-verdict="failed_again"]')).to_have_count(1, timeout=30_000)
    expect(page.locator("#regression-cases")).not_to_have_attribute("data-going", "true", timeout=10_000)
    operator.shot("regression-cases")

    viewer = browsers()
    viewer.sign_in(live_team.users["viewer"].username)
    seen = viewer.open(f"/w/{live_team.slug}/regression-cases/", live=False)
    expect(seen.locator(f"#agent-{agent} td[data-verdict=passed]")).to_have_count(1)
    assert "SECRET" not in seen.content()
    viewer.shot("regression-cases-viewer")
