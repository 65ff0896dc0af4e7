"""The console page of one's own API tokens: list, make (shown once), revoke."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from tenancy import tokens
from tenancy.models import ApiToken
from tests.conftest import Api, Team
from tests.factories import make_token


def _client(team: Team, role: str) -> Client:
    client = Client()
    client.force_login(team.users[role])
    return client


def _made(response: object) -> str:
    match = re.search(r'<p class="mono new-token">([^<]+)</p>', response.content.decode())  # type: ignore[attr-defined]
    assert match, "no new token on the page"
    return match.group(1)


def test_it_sends_anonymous_people_to_sign_in(team: Team) -> None:
    response = Client().get("/tokens/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    assert Client().post("/tokens/", {"label": "x"}).status_code == 302
    assert not ApiToken.objects.filter(label="x").exists()


@pytest.mark.parametrize("role", ["operator", "reader", "viewer", "outsider"])
def test_it_lets_everyone_make_list_and_revoke_their_own_tokens(team: Team, role: str) -> None:
    client = _client(team, role)
    response = client.post("/tokens/", {"label": "my script", "expires_in_days": "30"})
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    token = _made(response)
    row = ApiToken.objects.get(user=team.users[role], label="my script")
    assert row.digest == tokens.token_digest(token) and row.expires_at is not None
    assert Api(token).get("/agents")[0] == 200

    page = client.get("/tokens/").content.decode()
    assert "my script" in page and f"{token[:6]}…" in page and token not in page  # shown once only

    response = client.post(f"/tokens/{row.pk}/revoke/")
    assert response.status_code == 302
    assert Api(token).get("/agents")[0] == 401
    assert "revoked" in client.get("/tokens/").content.decode()


def test_it_shows_and_revokes_only_ones_own_tokens(team: Team) -> None:
    theirs = make_token(user=team.users["reader"])
    row = ApiToken.objects.get(digest=tokens.token_digest(theirs))
    ApiToken.objects.filter(pk=row.pk).update(label="the readers token")
    client = _client(team, "operator")
    assert "the readers token" not in client.get("/tokens/").content.decode()
    assert client.post(f"/tokens/{row.pk}/revoke/").status_code == 404
    assert ApiToken.objects.get(pk=row.pk).revoked_at is None and Api(theirs).get("/agents")[0] == 200


def test_it_answers_only_the_methods_it_knows(team: Team) -> None:
    client = _client(team, "viewer")
    assert client.get("/tokens/1/revoke/").status_code == 405
    assert client.put("/tokens/").status_code == 405


@pytest.mark.parametrize(
    "form,message",
    [
        ({"label": "x" * 101}, "at most 100 characters"),
        ({"label": "ok", "expires_in_days": "soon"}, "whole number of days"),
        ({"label": "ok", "expires_in_days": "99999"}, "from 1 to 3650 days"),
    ],
)
def test_it_refuses_bad_input_without_making_a_token(team: Team, form: dict[str, str], message: str) -> None:
    before = ApiToken.objects.filter(user=team.users["viewer"]).count()
    response = _client(team, "viewer").post("/tokens/", form)
    assert response.status_code == 400 and message in response.content.decode()
    assert ApiToken.objects.filter(user=team.users["viewer"]).count() == before


def test_it_caps_one_persons_live_tokens_without_touching_anyone_elses(team: Team, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokens, "LIVE_MAX", 3)
    client = _client(team, "viewer")
    for _ in range(2):  # the team's fixture gave the viewer one already
        assert client.post("/tokens/", {"label": "ok"}).status_code == 200
    response = client.post("/tokens/", {"label": "one too many"})
    assert response.status_code == 409 and "revoke one first" in response.content.decode()
    assert ApiToken.objects.filter(user=team.users["viewer"]).count() == 3
    assert _client(team, "reader").post("/tokens/", {"label": "mine"}).status_code == 200
    # Revoking frees a place.
    first = ApiToken.objects.filter(user=team.users["viewer"]).first()
    assert first is not None
    client.post(f"/tokens/{first.pk}/revoke/")
    assert client.post("/tokens/", {"label": "again"}).status_code == 200
