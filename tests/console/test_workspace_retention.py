"""A workspace's retention on its Settings page: shown to operators and set by them (blank: the
install's default, 0: for ever); anyone else cannot, and a bad value changes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client, override_settings

from tenancy.models import Workspace

pytestmark = pytest.mark.django_db


def client_of(team: Any, role: str) -> Client:
    client = Client()
    client.force_login(team.users[role])
    return client


def url(team: Any) -> str:
    return f"/w/{team.slug}/settings/retention/"


def days(team: Any) -> int | None:
    return Workspace.objects.get(pk=team.workspace.pk).retention_days


def test_it_refuses_get(team: Any) -> None:
    assert client_of(team, "operator").get(url(team)).status_code == 405


def test_anonymous_is_sent_to_sign_in(team: Any) -> None:
    answer = Client().post(url(team), {"retention_days": "30"})
    assert answer.status_code == 302 and "/login/" in answer["Location"]
    assert days(team) is None


@pytest.mark.parametrize(("role", "status"), [("outsider", 404), ("viewer", 403), ("reader", 403)])
def test_only_an_operator_sets_it(team: Any, role: str, status: int) -> None:
    assert client_of(team, role).post(url(team), {"retention_days": "30"}).status_code == status
    assert days(team) is None


def test_an_operator_sets_it_from_the_full_page(team: Any) -> None:
    answer = client_of(team, "operator").post(url(team), {"retention_days": "30"})
    assert answer.status_code == 302 and answer["Location"] == f"/w/{team.slug}/settings/"
    assert days(team) == 30


def test_an_operator_sets_it_with_htmx_and_gets_the_fragment(team: Any) -> None:
    answer = client_of(team, "operator").post(url(team), {"retention_days": "0"}, HTTP_HX_REQUEST="true")
    assert answer.status_code == 200
    body = answer.content.decode()
    assert body.lstrip().startswith('<form id="retention"') and "Saved: kept for ever" in body
    assert days(team) == 0


def test_blank_returns_to_the_installs_default(team: Any) -> None:
    client_of(team, "operator").post(url(team), {"retention_days": "45"})
    client_of(team, "operator").post(url(team), {"retention_days": ""})
    assert days(team) is None


@pytest.mark.parametrize("value", ["-1", "abc", "1.5", "36501", "99999999999999999999"])
@pytest.mark.parametrize("htmx", [False, True])
def test_a_bad_value_is_a_400_and_changes_nothing(team: Any, value: str, htmx: bool) -> None:
    client_of(team, "operator").post(url(team), {"retention_days": "30"})
    headers: dict[str, Any] = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    answer = client_of(team, "operator").post(url(team), {"retention_days": value}, **headers)
    assert answer.status_code == 400
    assert "whole days" in answer.content.decode()
    assert days(team) == 30


def test_the_settings_page_shows_the_retention_and_the_default(team: Any) -> None:
    with override_settings(OZ0_RETENTION_DAYS=90):
        body = client_of(team, "operator").get(f"/w/{team.slug}/settings/").content.decode()
    assert 'name="retention_days"' in body and "the install's default (90 days)" in body
