"""The Triggers page (issue 33 item 2): every member sees the workspace's triggers and their last
deliveries; an operator creates one (its secret shown once, in that answer only) and deletes
one; everyone else is refused and nothing changes; bad forms are typed refusals."""

from __future__ import annotations

import pytest
from django.test import Client

from schedules.models import Trigger
from tests.conftest import Team
from tests.schedules.test_triggers import PAYLOAD, _make, _post

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "triggers"}


def browser(team: Team, role: str) -> Client:
    client = Client()
    client.force_login(team.users[role])
    return client


def form(agent_name: str, **extra: str) -> dict[str, str]:
    return {
        "name": "github-prs",
        "agent": agent_name,
        "input_template": '{"pr": "/pull_request/number", "source": {"const": "github"}}',
        "key_in": "header",
        "key": "X-GitHub-Delivery",
        **extra,
    }


@pytest.mark.parametrize("role,expected", [("outsider", 404), ("viewer", 200), ("reader", 200), ("operator", 200)])
def test_every_member_sees_the_triggers_and_their_deliveries_and_only_operators_the_buttons(
    team: Team, agent: str, role: str, expected: int
) -> None:
    made = _make(team, agent)
    assert _post(made, PAYLOAD, **{"X-GitHub-Delivery": "d-1"}).status_code == 201
    answer = browser(team, role).get(f"/w/{team.slug}/triggers/")
    assert answer.status_code == expected
    if expected == 200:
        page = answer.content.decode()
        assert 'data-trigger="github-prs"' in page and "outcome-started" in page and made["url"] in page
        assert made["secret"] not in page  # shown once, at creation, never again
        assert ("New trigger" in page) is (role == "operator") and ('data-verb="delete"' in page) is (role == "operator")


def test_an_operator_creates_a_trigger_and_reads_its_secret_once(team: Team, agent: str) -> None:
    client = browser(team, "operator")
    answer = client.post(f"/w/{team.slug}/triggers/new/", form(agent), **HTMX)
    assert answer.status_code == 200
    page = answer.content.decode()
    trigger = Trigger.objects.get(workspace=team.workspace)
    assert "The secret is shown this once" in page and f"/api/v1/triggers/{trigger.public_id}" in page
    secret = page.split('id="trigger-secret-value">', 1)[1].split("<", 1)[0]
    # The secret shown works: a delivery signed with it starts a run; the page never shows it again.
    made = {"url": f"/api/v1/triggers/{trigger.public_id}", "secret": secret}
    assert _post(made, PAYLOAD, **{"X-GitHub-Delivery": "d-9"}).status_code == 201
    assert secret not in client.get(f"/w/{team.slug}/triggers/").content.decode()


@pytest.mark.parametrize("role,expected", [("outsider", 404), ("viewer", 403), ("reader", 403)])
def test_no_one_but_an_operator_creates_or_deletes_a_trigger(team: Team, agent: str, role: str, expected: int) -> None:
    client = browser(team, role)
    assert client.post(f"/w/{team.slug}/triggers/new/", form(agent, name="theirs")).status_code == expected
    assert not Trigger.objects.filter(name="theirs").exists()
    made = _make(team, agent)
    assert client.post(f"/w/{team.slug}/triggers/{made['id']}/delete/").status_code == expected
    assert Trigger.objects.filter(pk=made["id"]).exists()


def test_an_operator_deletes_a_trigger_and_its_url_starts_nothing(team: Team, agent: str) -> None:
    made = _make(team, agent)
    answer = browser(team, "operator").post(f"/w/{team.slug}/triggers/{made['id']}/delete/", **HTMX)
    assert answer.status_code == 200 and "its URL starts nothing now" in answer.content.decode()
    assert _post(made, PAYLOAD, **{"X-GitHub-Delivery": "d-1"}).status_code == 404


@pytest.mark.parametrize(
    "change,key",
    [
        ({"input_template": "{not json"}, "invalid_json"),
        ({"input_template": '{"pr": "no-leading-slash"}'}, "invalid_template"),
        ({"input_template": "[" * 5000 + "]" * 5000}, "too_deep"),
        ({"name": "has spaces"}, "invalid_name"),
        ({"key_in": "cookie"}, "invalid_idempotency"),
        ({"key": ""}, "invalid_idempotency"),
        ({"agent": "no-such-agent"}, "unknown_agent"),
    ],
)
def test_a_bad_form_is_a_typed_refusal_that_creates_nothing(team: Team, agent: str, change: dict[str, str], key: str) -> None:
    answer = browser(team, "operator").post(f"/w/{team.slug}/triggers/new/", form(agent, **change), **HTMX)
    assert 400 <= answer.status_code < 500 and key in answer.content.decode(), answer.content.decode()[:400]
    assert not Trigger.objects.filter(workspace=team.workspace).exists()


def test_a_plain_form_post_answers_the_page_with_the_secret_not_a_redirect_that_loses_it(team: Team, agent: str) -> None:
    answer = browser(team, "operator").post(f"/w/{team.slug}/triggers/new/", form(agent))
    assert answer.status_code == 200 and "The secret is shown this once" in answer.content.decode()


def test_a_trigger_of_another_workspace_is_not_found(team: Team, agent: str) -> None:
    other = Team()
    made = _make(team, agent)
    client = Client()
    client.force_login(other.users["operator"])
    assert client.post(f"/w/{other.slug}/triggers/{made['id']}/delete/").status_code == 404
    assert Trigger.objects.filter(pk=made["id"]).exists()
