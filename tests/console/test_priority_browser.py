"""Priorities on the run page in headless Chromium (issue 33 item 3): a run created high or low
says so in its head; a normal one shows no badge."""

from __future__ import annotations

from typing import Any

import pytest

from runs import kernel
from tests.conftest import Team
from tests.console.test_browser import expect, no_csp_violations

pytestmark = [pytest.mark.browser, pytest.mark.live, pytest.mark.usefixtures("committed", "no_dispatch")]


def test_a_viewer_reads_a_runs_priority_on_its_page(browsers: Any) -> None:
    team = Team()
    runs = {}
    for priority in ("high", "low", "normal"):
        body = {"tasks": [{"key": "gate", "kind": "await"}], "priority": priority}
        runs[priority], _ = kernel.create_run(workspace=team.workspace, user=team.users["operator"], body=body)
    viewer = browsers()
    viewer.sign_in(team.users["viewer"].username)
    for priority in ("high", "low"):
        page = viewer.open(f"/runs/{runs[priority].pk}/")
        expect(page.locator("#run-priority")).to_contain_text(f"priority {priority}")
    page = viewer.open(f"/runs/{runs['normal'].pk}/")
    expect(page.locator("#run-status")).to_be_visible()
    expect(page.locator("#run-priority")).to_have_count(0)
    no_csp_violations(viewer)
