"""The subscriptions page in headless Chromium against daphne: subscribe, see the secret once, delete."""

from __future__ import annotations

from typing import Any

import pytest

from notify.models import Subscription
from tests.conftest import Team

pytestmark = [pytest.mark.browser, pytest.mark.live, pytest.mark.usefixtures("committed")]

HOOK = "https://hooks.example.com/services/T0/B0/browser-secret-path"


def test_a_reader_subscribes_sees_the_secret_once_and_deletes(live_team: Team, browsers: Any) -> None:
    reader = browsers()
    reader.sign_in(live_team.users["reader"].username)
    page = reader.open(f"/w/{live_team.slug}/inbox/")
    page.click("a.topbar-link:has-text('Notifications')")
    page.wait_for_url("**/subscriptions/")
    assert "You have no subscriptions." in page.content()
    page.select_option("select[name=workspace]", live_team.slug)
    page.uncheck("input[name=kinds][value=question]")
    page.fill("input[name=webhook_url]", HOOK)
    page.fill("input[name=interval_minutes]", "30")
    page.click("button:has-text('Subscribe')")
    page.wait_for_load_state("networkidle")
    row = Subscription.objects.get(user=live_team.users["reader"])
    assert (row.kinds, row.interval_seconds) == (
        ["approval", "hold", "rollback", "deadline"],
        1800,
    )  # every kind but the one unticked
    assert page.locator(".new-token").inner_text().strip() == row.secret
    reader.shot("notify-subscribed")
    page = reader.open("/subscriptions/", live=False)
    html = page.content()
    assert row.secret not in html and "browser-secret-path" not in html
    assert page.locator(f"#subscription-{row.pk}").inner_text().count("approval, hold") == 1
    page.click(f"#subscription-{row.pk} button:has-text('Delete')")
    page.wait_for_load_state("networkidle")
    assert "You have no subscriptions." in page.content()
    assert not Subscription.objects.filter(pk=row.pk).exists()
    # As the console's browser tests: no Content Security Policy violation on the page.
    assert not [e for e in reader.errors if "Content Security Policy" in e], reader.errors
