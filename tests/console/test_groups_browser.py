"""Failure groups and search in a browser (issue 31): from a scorecard's top groups to a group's
page, where an operator marks it resolved; a viewer sees kinds and counts, no words; the
scorecard's search box finds a failure by a word of its message."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from runs import kernel
from runs.models import Run
from tests.conftest import Team, wait_for
from tests.console import states

pytestmark = [pytest.mark.browser, pytest.mark.live, pytest.mark.usefixtures("committed")]


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def failed_run(team: Team, agent: str, message: str) -> Run:
    body = {
        "agent": agent,
        "tasks": [
            {
                "key": "r1",
                "kind": "round",
                "model": "script",
                "prompt": "go",
                "tools": ["oz.fail"],
                "script": [{"oz_fail": {"kind": "not_found", "message": message}}],
            }
        ],
    }
    run, _ = kernel.create_run(workspace=team.workspace, user=team.users["operator"], body=body)
    wait_for(lambda: Run.objects.get(pk=run.pk).status in ("canceled", "failed"), message="the run failed")
    return run


@pytest.mark.spec("F11", "F12", "F18")
def test_an_operator_resolves_a_group_reached_from_the_scorecard_and_a_viewer_sees_no_words(
    live_team: Team, browsers: Any
) -> None:
    name = states.agent(f"grp-{uuid.uuid4().hex[:6]}", live_team.workspace)
    failed_run(live_team, name, "ledger row 'WORDS-NOT-FOR-VIEWERS-1' missing after 3 tries")
    failed_run(live_team, name, "ledger row 'WORDS-NOT-FOR-VIEWERS-2' missing after 8 tries")

    operator = browsers()
    operator.sign_in(live_team.users["operator"].username)
    page = operator.open(f"/w/{live_team.slug}/agents/{name}/")
    expect(page.get_by_role("heading", name="Top failure groups")).to_be_visible()
    groups = page.locator("table.groups tbody tr")
    expect(groups).to_have_count(1)
    expect(groups.first).to_contain_text("2")
    groups.first.get_by_role("link").click()
    expect(page.locator("pre.shape")).to_have_text("ledger row '…' missing after <n> tries")
    page.get_by_label("Resolved in version").fill("1")
    page.get_by_role("button", name="Mark resolved").click()
    expect(page.locator("#group-status")).to_contain_text("Resolved in v1")
    group_url = page.url
    operator.shot("group-resolved")

    # The search box of the scorecard finds both runs by a word of their message.
    page = operator.open(f"/w/{live_team.slug}/agents/{name}/")
    page.get_by_label("Search findings").fill("ledger missing")
    page.get_by_role("button", name="Search").click()
    expect(page.locator("#findings table.findings tbody tr")).to_have_count(2)

    viewer = browsers()
    viewer.sign_in(live_team.users["viewer"].username)
    page = viewer.open(group_url.removeprefix(viewer.server.url))
    expect(page.locator(".shape-hidden")).to_be_visible()
    expect(page.locator("#group-status")).to_contain_text("Resolved in v1")
    expect(page.get_by_role("button", name="Mark resolved")).to_have_count(0)
    assert "WORDS-NOT-FOR-VIEWERS" not in page.content() and "missing after" not in page.content()
    viewer.shot("group-viewer")
    assert not [e for e in operator.errors + viewer.errors if "Content Security Policy" in e]
