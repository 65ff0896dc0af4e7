"""Approver groups in a browser (issue 31 item 4): an operator makes a group for `test.effect*` on
the Settings page; the inbox then shows a call with effects as the group's, with no buttons for the
operator outside it, and its member approves it from their own inbox."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from runs.models import Task
from tests.conftest import Team, wait_for
from tests.console.test_approvals_browser import waiting_call
from tests.console.test_approvers_page import waited
from tests.factories import make_member

pytestmark = [pytest.mark.browser, pytest.mark.live, pytest.mark.usefixtures("committed")]


@pytest.mark.spec("S5", "S6")
def test_an_operator_makes_a_group_and_only_its_member_approves_from_the_inbox(live_team: Team, browsers: Any) -> None:
    payer = make_member(workspace=live_team.workspace, role="operator")
    run = waiting_call(live_team, "test.effect", {"id": f"approvers-{live_team.slug}"})

    operator = browsers()
    operator.sign_in(live_team.users["operator"].username)
    page = operator.open(f"/w/{live_team.slug}/settings/", live=False)
    page.fill("#group-name", "finance")
    page.fill("#group-tools", "test.effect*")
    page.check(f"#approvers input[name=members][value='{payer.username}']")
    page.get_by_role("button", name="Save group").click()
    expect(page.locator("#approvers [role=status]")).to_contain_text("Saved the approver group finance")
    expect(page.locator("#approvers table")).to_contain_text("test.effect*")
    page.fill("#reminder-minutes", "1")
    page.fill("#escalation-minutes", "2")
    page.get_by_role("button", name="Save deadlines").click()
    expect(page.locator("#approvers [role=status]")).to_contain_text("Saved the deadlines")
    operator.shot("approvers-settings")
    waited(run, 180)  # parked three minutes ago: past both deadlines

    inbox = operator.open(f"/w/{live_team.slug}/inbox/")
    item = inbox.locator(f"article[data-run='{run.pk}']")
    expect(item.locator(".item-owners")).to_contain_text("group finance")
    expect(item.locator(".not-yours")).to_contain_text("Not yours to decide")
    expect(item.locator("button[data-verb=approve]")).to_have_count(0)
    expect(item.locator(".chip.deadline")).to_have_text("overdue")
    operator.shot("approvers-inbox-not-yours")

    member = browsers()
    member.sign_in(payer.username)
    mine = member.open(f"/w/{live_team.slug}/inbox/")
    card = mine.locator(f"article[data-run='{run.pk}']")
    expect(card.locator(".chip.yours")).to_be_visible()
    card.locator("form.inline-form input[name=confirm_effects]").check()
    card.locator("button[data-verb=approve]").click()
    expect(mine.locator("#toasts")).to_contain_text("Approved")
    member.shot("approvers-inbox-member-approved")
    wait_for(lambda: Task.objects.get(run=run, key="r1.1").status != "needs_approval", message="r1.1 approved")
