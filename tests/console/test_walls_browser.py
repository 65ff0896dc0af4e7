"""Walls in a browser (issue 31 item 6): an operator walls a reader off from an agent on the
Settings page; the reader's run page then says why its words are hidden and shows none."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from runs import kernel
from runs.models import Run
from tests.conftest import Team
from tests.insights.planting import make_agent

pytestmark = pytest.mark.browser


@pytest.mark.spec("F11")
def test_an_operator_walls_a_reader_off_and_the_readers_run_page_hides_the_words(live_team: Team, browsers: Any) -> None:
    make_agent("payroll", workspace=live_team.workspace)
    run, _ = kernel.create_run(
        workspace=live_team.workspace,
        user=live_team.users["operator"],
        body={
            "tasks": [{"key": "gate", "kind": "await", "question": "SECRET-PAYROLL-QUESTION"}],
            "input": {"note": "SECRET-PAYROLL-INPUT"},
        },
    )
    Run.objects.filter(pk=run.pk).update(agent_name="payroll")
    reader_name = live_team.users["reader"].username

    reader = browsers()
    reader.sign_in(reader_name)
    before = reader.open(f"/runs/{run.pk}/", live=False)
    expect(before.locator("body")).to_contain_text("SECRET-PAYROLL-QUESTION")

    operator = browsers()
    operator.sign_in(live_team.users["operator"].username)
    page = operator.open(f"/w/{live_team.slug}/settings/", live=False)
    page.select_option("#wall-agent", "payroll")
    page.check(f"#walls input[name=members][value='{reader_name}']")
    page.get_by_role("button", name="Save wall").click()
    expect(page.locator("#walls table")).to_contain_text(reader_name)
    expect(page.locator("#walls [role=status]")).to_contain_text("Saved the wall around payroll")
    operator.shot("walls-settings")

    after = reader.open(f"/runs/{run.pk}/", live=False)
    expect(after.locator(".run-hidden")).to_contain_text("a wall around payroll")
    assert "SECRET-PAYROLL" not in after.content()
    reader.shot("walls-reader-run-page")
