"""Issue 30.6: a half-typed deny reason survives a live refresh (its box is hx-preserve'd) and,
when the refresh drops its call because someone decided it first, says who decided it meanwhile
and shows the words typed, unsent. The drafts a refresh names are hints: malformed, huge or
another workspace's are dropped, never a 500. In Chromium: type a reason, another approves, read
the notice."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.test import Client

from runs import kernel
from tests.conftest import Team, wait_for
from tests.console import states
from tests.factories import make_member, make_workspace


def inbox(team: Team, role: str, drafts: list[str]) -> Any:
    client = Client()
    client.force_login(team.users[role])
    return client.get(f"/w/{team.slug}/inbox/", {"draft": drafts}, HTTP_HX_REQUEST="true")


@pytest.mark.django_db
@pytest.mark.parametrize("role", ["operator", "reader", "viewer"])
def test_a_refresh_says_who_decided_a_draft_meanwhile(team: Team, no_dispatch: list[int], role: str) -> None:
    decided = states.approval_run(team.workspace, team.users["operator"])
    waiting = states.approval_run(team.workspace, team.users["operator"])
    colleague = make_member(workspace=team.workspace, role="operator", username=f"first-{uuid.uuid4().hex[:6]}")
    kernel.deny(run_id=decided.pk, key="r1.1", user=colleague, reason="no")
    html = inbox(team, role, [f"{decided.pk}:r1.1", f"{waiting.pk}:r1.1"]).content.decode()
    assert f'data-draft="{decided.pk}:r1.1"' in html
    assert f"already denied by {colleague.username}; it is now failed" in html
    assert f'data-draft="{waiting.pk}:r1.1"' not in html  # still waiting: its card (and draft) stay


@pytest.mark.django_db
def test_drafts_that_are_malformed_or_not_this_workspaces_are_dropped(team: Team, no_dispatch: list[int]) -> None:
    elsewhere = make_workspace()
    foreign = states.approval_run(elsewhere, make_member(workspace=elsewhere, role="operator"))
    kernel.approve(run_id=foreign.pk, key="r1.1", user=foreign.created_by)
    drafts = [
        f"{foreign.pk}:r1.1",
        "not-a-run:r1.1",
        f"{uuid.uuid4()}:",
        f"{uuid.uuid4()}:" + "k" * 5000,
        "x" * 100_000,
        *[f"{uuid.uuid4()}:r{n}" for n in range(50)],
    ]
    response = inbox(team, "operator", drafts)
    assert response.status_code == 200 and "data-draft" not in response.content.decode()
    assert inbox(team, "outsider", [f"{foreign.pk}:r1.1"]).status_code == 404


@pytest.mark.browser
@pytest.mark.live
@pytest.mark.usefixtures("committed")
def test_in_the_browser_a_half_typed_reason_survives_and_tells_who_decided(live_team: Team, browsers: Any) -> None:
    from playwright.sync_api import expect

    from runs.models import Task
    from tests.console.test_browser import waiting_for_approval

    first = waiting_for_approval(live_team)
    second = waiting_for_approval(live_team)
    colleague = make_member(workspace=live_team.workspace, role="operator", username=f"quick-{uuid.uuid4().hex[:6]}")
    browser = browsers()
    browser.sign_in(live_team.users["operator"].username)
    page = browser.open(f"/w/{live_team.slug}/inbox/")
    card = page.locator(f'article[data-run="{first.pk}"]')
    card.locator("details.deny summary").click()
    card.locator("input[name=reason]").fill("half a thought about")

    # Another change refreshes the list: the half-typed reason is still there.
    kernel.approve(run_id=second.pk, key="r1.1", user=colleague)
    expect(page.locator(f'article[data-run="{second.pk}"]')).to_have_count(0, timeout=15_000)
    expect(card.locator("input[name=reason]")).to_have_value("half a thought about")

    # Someone decides this very call: the card leaves, and the notice says who and keeps the words.
    kernel.approve(run_id=first.pk, key="r1.1", user=colleague)
    wait_for(lambda: Task.objects.get(run=first, key="r1.1").status != "needs_approval", message="decided")
    notice = page.locator(f'.meanwhile[data-draft="{first.pk}:r1.1"]')
    expect(notice).to_contain_text(f"already approved by {colleague.username}", timeout=15_000)
    expect(notice.locator(".draft-text")).to_have_text("What you typed was not sent: \u201chalf a thought about\u201d")
    expect(page.locator(f'article[data-run="{first.pk}"]')).to_have_count(0)
    browser.shot("inbox-decided-meanwhile")
    notice.locator(".toast-close").click()
    expect(page.locator(".meanwhile")).to_have_count(0)
    assert not [e for e in browser.errors if "Content Security Policy" in e], browser.errors
