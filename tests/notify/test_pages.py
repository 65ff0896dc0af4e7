"""The console page of one's own subscriptions: list with status, make one (secret shown once), delete."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from notify import subscriptions
from notify.models import Subscription
from tests.conftest import Team

pytestmark = pytest.mark.django_db

HOOK = "https://hooks.example.com/services/T0/B0/secret-path"


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def form(team: Team, **fields: Any) -> dict[str, Any]:
    return {"workspace": team.slug, "kinds": ["approval", "question"], "webhook_url": HOOK, "interval_minutes": "10", **fields}


@pytest.mark.parametrize("role", ["operator", "reader", "viewer"])
def test_a_member_subscribes_on_the_page_and_sees_the_secret_once(team: Team, role: str) -> None:
    client = signed_in(team.users[role])
    page = client.get("/subscriptions/")
    assert page.status_code == 200 and "You have no subscriptions." in page.content.decode()
    assert 'href="/subscriptions/"' in page.content.decode()
    answer = client.post("/subscriptions/", form(team))
    assert answer.status_code == 200 and answer["Cache-Control"] == "no-store"
    row = Subscription.objects.get(user=team.users[role])
    assert (row.kinds, row.interval_seconds, row.webhook_url) == (["approval", "question"], 600, HOOK)
    assert row.secret in answer.content.decode()
    again = client.get("/subscriptions/").content.decode()
    assert row.secret not in again and HOOK not in again and "https://hooks.example.com/…" in again
    assert "no digest yet" in again


def test_an_outsider_cannot_subscribe_to_a_workspace(team: Team) -> None:
    answer = signed_in(team.users["outsider"]).post("/subscriptions/", form(team))
    assert answer.status_code == 404 and "Not made" in answer.content.decode()
    assert not Subscription.objects.exists()


@pytest.mark.parametrize(
    "fields",
    [
        {"kinds": []},
        {"interval_minutes": "1"},
        {"interval_minutes": "9" * 40},
        {"interval_minutes": "ten"},
        {"webhook_url": "http://169.254.169.254/latest"},
        {"webhook_url": "gopher://x.example.com/"},
        {"webhook_url": ""},
        {"workspace": "\x00"},
        {"agent": "a\x00b"},
    ],
)
def test_bad_form_input_is_told_and_writes_nothing(team: Team, fields: dict[str, Any]) -> None:
    answer = signed_in(team.users["operator"]).post("/subscriptions/", form(team, **fields))
    assert answer.status_code in (400, 404) and "Not made" in answer.content.decode()
    assert not Subscription.objects.exists()


def test_the_page_shows_a_failing_delivery(team: Team) -> None:
    row, _ = subscriptions.create(team.users["reader"], {"workspace": team.slug, "kinds": ["hold"], "webhook_url": HOOK})
    Subscription.objects.filter(pk=row.pk).update(last_error="webhook: answered HTTP 500", consecutive_failures=3)
    page = signed_in(team.users["reader"]).get("/subscriptions/").content.decode()
    assert "failing" in page and "webhook: answered HTTP 500" in page and "3 failures in a row" in page


def test_only_the_owner_deletes(team: Team) -> None:
    row, _ = subscriptions.create(team.users["reader"], {"workspace": team.slug, "kinds": ["hold"], "webhook_url": HOOK})
    for role in ("operator", "viewer", "outsider"):
        assert signed_in(team.users[role]).post(f"/subscriptions/{row.pk}/delete/").status_code == 404
    assert signed_in(team.users["reader"]).get(f"/subscriptions/{row.pk}/delete/").status_code == 405
    answer = signed_in(team.users["reader"]).post(f"/subscriptions/{row.pk}/delete/")
    assert answer.status_code == 302 and not Subscription.objects.exists()


def test_the_page_needs_a_sign_in() -> None:
    answer = Client().get("/subscriptions/")
    assert answer.status_code == 302 and answer["Location"].startswith("/login/")
