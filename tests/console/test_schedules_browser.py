"""The Schedules page in headless Chromium against daphne: an operator creates a schedule (a bad
cron first, refused in the form), sees its next fire times, pauses, resumes and deletes it; a
viewer sees the list without the form or the buttons."""

from __future__ import annotations

from typing import Any

import pytest

from schedules import firing, services
from schedules.models import Schedule
from tests.conftest import Team
from tests.console.test_browser import expect, no_csp_violations
from tests.schedules.conftest import agent_of

pytestmark = [pytest.mark.browser, pytest.mark.live, pytest.mark.usefixtures("committed", "no_dispatch")]


def test_an_operator_manages_schedules_and_a_viewer_only_reads(browsers: Any) -> None:
    team = Team()
    agent = agent_of(team, "browser-report")
    operator = browsers()
    operator.sign_in(team.users["operator"].username)
    page = operator.open(f"/w/{team.slug}/schedules/")
    expect(page.locator("#schedules .empty")).to_contain_text("No schedules yet")

    page.fill("#schedule-form input[name=name]", "nightly")
    page.fill("#schedule-form input[name=agent]", agent)
    page.fill("#schedule-form textarea[name=input]", '{"day": "today"}')
    page.fill("#schedule-form input[name=cron]", "61 * * * *")
    page.fill("#schedule-form input[name=timezone]", "Europe/Paris")
    page.click("#schedule-form button[type=submit]")
    expect(page.locator('#toasts [data-outcome="refused"]')).to_contain_text("invalid_cron")
    assert not Schedule.objects.filter(workspace=team.workspace).exists()

    expect(page.locator("#schedule-form input[name=name]")).to_have_value("nightly")  # kept as typed
    page.fill("#schedule-form input[name=cron]", "0 3 * * *")
    page.click("#schedule-form button[type=submit]")
    row = page.locator('tr[data-schedule="nightly"]')
    expect(row).to_be_visible()
    expect(page.locator('#schedules [role="status"]')).to_contain_text("Created nightly.")
    expect(row.locator(".next-fire time")).to_have_count(3)
    operator.shot("schedules")

    row.locator('button[data-verb="pause"]').click()
    expect(row).to_have_attribute("data-paused", "true")
    expect(row.locator(".next-fire")).to_contain_text("paused")
    row.locator('button[data-verb="resume"]').click()
    expect(row).to_have_attribute("data-paused", "false")
    expect(row.locator(".next-fire time")).to_have_count(3)

    # A firing shows as the row's last firing, with its run.
    schedule = Schedule.objects.get(workspace=team.workspace, name="nightly")
    Schedule.objects.filter(pk=schedule.pk).update(next_fire_at=schedule.created_at)
    firing.fire_due()
    page.reload()
    expect(page.locator('tr[data-schedule="nightly"] .outcome-started')).to_have_text("started")

    viewer = browsers()
    viewer.sign_in(team.users["viewer"].username)
    seen = viewer.open(f"/w/{team.slug}/schedules/")
    expect(seen.locator('tr[data-schedule="nightly"]')).to_be_visible()
    expect(seen.locator("#schedule-form")).to_have_count(0)
    expect(seen.locator('button[data-verb="pause"]')).to_have_count(0)

    page.locator('tr[data-schedule="nightly"] button[data-verb="delete"]').click()  # the confirm is accepted
    expect(page.locator('tr[data-schedule="nightly"]')).to_have_count(0)
    expect(page.locator('#schedules [role="status"]')).to_contain_text("Deleted nightly.")
    assert not Schedule.objects.filter(workspace=team.workspace).exists()
    assert services.events_page(team.workspace, None)["items"][0]["verb"] == "deleted"
    no_csp_violations(operator, viewer)
