"""The Triggers page in headless Chromium against daphne: an operator creates a trigger (a bad
template first, refused in a toast), reads its secret once, sees a signed delivery start a run,
and deletes it; a viewer sees the list without the form or the buttons."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from schedules import triggers
from schedules.models import Trigger
from tests.conftest import Team
from tests.console.test_browser import expect, no_csp_violations
from tests.schedules.conftest import agent_of

pytestmark = [pytest.mark.browser, pytest.mark.live, pytest.mark.usefixtures("committed", "no_dispatch")]


def test_an_operator_creates_reads_the_secret_once_and_deletes_a_trigger_and_a_viewer_only_reads(browsers: Any) -> None:
    team = Team()
    agent = agent_of(team, "browser-triage")
    operator = browsers()
    operator.sign_in(team.users["operator"].username)
    page = operator.open(f"/w/{team.slug}/triggers/")
    expect(page.locator("#triggers .empty")).to_contain_text("No triggers yet")

    page.fill("#trigger-form input[name=name]", "tickets")
    page.fill("#trigger-form input[name=agent]", agent)
    page.fill("#trigger-form textarea[name=input_template]", '{"ticket": "no-slash"}')
    page.fill("#trigger-form input[name=key]", "/id")
    page.check("#trigger-form input[name=key_in][value=field]")
    page.click("#trigger-form button[type=submit]")
    expect(page.locator('#toasts [data-outcome="refused"]')).to_contain_text("invalid_template")
    assert not Trigger.objects.filter(workspace=team.workspace).exists()

    page.fill("#trigger-form textarea[name=input_template]", '{"ticket": "/ticket/id"}')
    page.click("#trigger-form button[type=submit]")
    expect(page.locator("#trigger-secret")).to_contain_text("The secret is shown this once")
    secret = page.locator("#trigger-secret-value").inner_text()
    trigger = Trigger.objects.get(workspace=team.workspace)

    body = json.dumps({"id": "T-1", "ticket": {"id": 7}}).encode()
    delivered = Client().post(
        f"/api/v1/triggers/{trigger.public_id}",
        body,
        content_type="application/json",
        HTTP_X_OZ0_SIGNATURE=triggers.signature(secret, body),
    )
    assert delivered.status_code == 201, delivered.content
    page = operator.open(f"/w/{team.slug}/triggers/")
    row = page.locator('tr[data-trigger="tickets"]')
    expect(row).to_contain_text("started")
    assert secret not in page.content()
    operator.shot("triggers")

    viewer = browsers()
    viewer.sign_in(team.users["viewer"].username)
    seen = viewer.open(f"/w/{team.slug}/triggers/")
    expect(seen.locator('tr[data-trigger="tickets"]')).to_be_visible()
    expect(seen.locator("#trigger-form")).to_have_count(0)
    expect(seen.locator('[data-verb="delete"]')).to_have_count(0)

    row.locator('[data-verb="delete"]').click()
    expect(page.locator("#triggers [role=status]")).to_contain_text("its URL starts nothing now")
    assert not Trigger.objects.filter(workspace=team.workspace).exists()
    no_csp_violations(operator, viewer)
