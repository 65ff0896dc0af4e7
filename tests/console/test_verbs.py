"""Every POST view of the console: 405 on GET, anonymous, outsider, each role, htmx and full page,
and the loser of a race told what happened instead of an error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from runs.models import Run, Task
from tests.conftest import Team
from tests.console import states

pytestmark = pytest.mark.django_db


def client_for(team: Team, role: str) -> Client:
    client = Client()
    client.force_login(team.users[role])
    return client


def held(team: Team) -> Run:
    return states.halted_run(team.workspace, team.users["operator"])


def waiting(team: Team) -> Run:
    return states.approval_run(team.workspace, team.users["operator"])


def asking(team: Team) -> Run:
    return states.question_run(team.workspace, team.users["operator"])


# (name, make the run, url, form data, check the effect on the run)
VERBS: list[tuple[str, Callable[[Team], Run], str, dict[str, str], Callable[[Run], bool]]] = [
    (
        "approve",
        waiting,
        "/runs/{run}/tasks/r1.1/approve/",
        {},
        lambda r: Task.objects.get(run=r, key="r1.1").status == "waiting",
    ),
    (
        "deny",
        waiting,
        "/runs/{run}/tasks/r1.1/deny/",
        {"reason": "not today"},
        lambda r: Task.objects.get(run=r, key="r1.1").error_detail == "not today",
    ),
    (
        "answer",
        asking,
        "/runs/{run}/tasks/r1.1/answer/",
        {"value": "eu-west"},
        lambda r: Task.objects.get(run=r, key="r1.1").result == {"value": "eu-west"},
    ),
    ("retry", held, "/runs/{run}/tasks/a/retry/", {}, lambda r: Task.objects.get(run=r, key="a").failure_resolution == "retried"),
    (
        "abandon",
        held,
        "/runs/{run}/tasks/a/abandon/",
        {},
        lambda r: Task.objects.get(run=r, key="a").failure_resolution == "abandoned",
    ),
    (
        "abandon_and_cancel",
        held,
        "/runs/{run}/tasks/a/abandon-and-cancel/",
        {},
        lambda r: (
            Task.objects.get(run=r, key="a").failure_resolution == "abandoned"
            and Run.objects.get(pk=r.pk).status in ("canceling", "canceled")
        ),
    ),
    (
        "cancel",
        held,
        "/runs/{run}/cancel/",
        {"reason": "enough"},
        lambda r: Run.objects.get(pk=r.pk).status in ("canceling", "canceled"),
    ),
    ("pause", waiting, "/runs/{run}/pause/", {}, lambda r: Run.objects.get(pk=r.pk).status == "paused"),
    (
        "append",
        held,
        "/runs/{run}/append/",
        {"tasks": '[{"key": "fix", "kind": "tool", "tool": "test.echo", "args": {"value": 2}, "after": []}]'},
        lambda r: Task.objects.filter(run=r, key="fix").exists(),
    ),
]
IDS = [v[0] for v in VERBS]


@pytest.mark.parametrize(("name", "make", "url", "data", "done"), VERBS, ids=IDS)
def test_it_refuses_get(team: Team, name: str, make: Any, url: str, data: dict[str, str], done: Any) -> None:
    run = make(team)
    assert client_for(team, "operator").get(url.format(run=run.pk)).status_code == 405
    assert not done(run)


@pytest.mark.parametrize(("name", "make", "url", "data", "done"), VERBS, ids=IDS)
def test_it_sends_the_anonymous_to_sign_in(team: Team, name: str, make: Any, url: str, data: dict[str, str], done: Any) -> None:
    run = make(team)
    response = Client().post(url.format(run=run.pk), data)
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    assert not done(run)


@pytest.mark.parametrize(("name", "make", "url", "data", "done"), VERBS, ids=IDS)
def test_it_hides_the_run_from_outsiders(team: Team, name: str, make: Any, url: str, data: dict[str, str], done: Any) -> None:
    run = make(team)
    assert client_for(team, "outsider").post(url.format(run=run.pk), data).status_code == 404
    assert not done(run)


@pytest.mark.spec("F11")
@pytest.mark.parametrize("role", ["viewer", "reader"])
@pytest.mark.parametrize(("name", "make", "url", "data", "done"), VERBS, ids=IDS)
def test_it_forbids_members_without_write_standing(
    team: Team, role: str, name: str, make: Any, url: str, data: dict[str, str], done: Any
) -> None:
    run = make(team)
    response = client_for(team, role).post(url.format(run=run.pk), data)
    assert response.status_code == 403 and b"operator" in response.content
    assert not done(run)


@pytest.mark.parametrize(("name", "make", "url", "data", "done"), VERBS, ids=IDS)
def test_it_acts_for_an_operator_over_htmx(team: Team, name: str, make: Any, url: str, data: dict[str, str], done: Any) -> None:
    run = make(team)
    response = client_for(team, "operator").post(url.format(run=run.pk), data, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert response["HX-Trigger"] == "oz0:changed"
    assert b'data-outcome="ok"' in response.content and b"<html" not in response.content
    assert done(run)


@pytest.mark.parametrize(("name", "make", "url", "data", "done"), VERBS, ids=IDS)
def test_it_acts_for_an_operator_without_javascript(
    team: Team, name: str, make: Any, url: str, data: dict[str, str], done: Any
) -> None:
    run = make(team)
    client = client_for(team, "operator")
    back = f"/w/{team.slug}/inbox/"
    response = client.post(url.format(run=run.pk), {**data, "next": back})
    assert response.status_code == 302 and response["Location"] == back
    assert done(run)
    page = client.get(back).content.decode()
    assert 'class="toast toast-ok"' in page


def test_it_never_redirects_off_site(team: Team) -> None:
    run = waiting(team)
    response = client_for(team, "operator").post(f"/runs/{run.pk}/tasks/r1.1/approve/", {"next": "https://evil.example/"})
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.pk}/"


@pytest.mark.spec("S5", "S6")
def test_it_tells_the_second_approver_who_decided(team: Team) -> None:
    run = waiting(team)
    first = client_for(team, "operator").post(f"/runs/{run.pk}/tasks/r1.1/approve/", HTTP_HX_REQUEST="true")
    assert b'data-outcome="ok"' in first.content
    other = states_second_operator(team)
    second = other.post(f"/runs/{run.pk}/tasks/r1.1/deny/", {"reason": "late"}, HTTP_HX_REQUEST="true")
    assert second.status_code == 200
    text = second.content.decode()
    assert 'data-outcome="refused"' in text and "Already decided" in text
    assert f"by {team.users['operator'].username}" in text and "approve" in text
    assert Task.objects.get(run=run, key="r1.1").error_key is None  # the deny changed nothing


def states_second_operator(team: Team) -> Client:
    from tests.factories import make_member

    user = make_member(workspace=team.workspace, role="operator")
    client = Client()
    client.force_login(user)
    return client


def test_it_tells_a_double_click_without_javascript_as_a_message(team: Team) -> None:
    run = waiting(team)
    client = client_for(team, "operator")
    client.post(f"/runs/{run.pk}/tasks/r1.1/approve/")
    response = client.post(f"/runs/{run.pk}/tasks/r1.1/approve/", follow=True)
    assert response.status_code == 200
    assert "Already decided" in response.content.decode()


@pytest.mark.spec("S15", "S16")
def test_it_refuses_to_abandon_what_is_not_a_candidate(team: Team) -> None:
    run = held(team)
    client = client_for(team, "operator")
    client.post(f"/runs/{run.pk}/tasks/a/abandon/", HTTP_HX_REQUEST="true")
    again = client.post(f"/runs/{run.pk}/tasks/a/retry/", HTTP_HX_REQUEST="true").content.decode()
    assert 'data-outcome="refused"' in again and "No longer repairable" in again
    never_failed = client.post(f"/runs/{run.pk}/tasks/c/abandon/", HTTP_HX_REQUEST="true").content.decode()
    assert "No longer repairable" in never_failed or "finished" in never_failed


def test_it_offers_repairs_only_for_candidates(team: Team) -> None:
    run = held(team)
    client = client_for(team, "operator")
    page = client.get(f"/w/{team.slug}/holds/").content.decode()
    assert f'action="/runs/{run.pk}/tasks/a/retry/"' in page
    assert f'action="/runs/{run.pk}/tasks/c/retry/"' not in page
    client.post(f"/runs/{run.pk}/tasks/a/abandon/")
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert f'action="/runs/{run.pk}/tasks/a/retry/"' not in page


def test_it_reports_a_bad_append_and_changes_nothing(team: Team) -> None:
    run = held(team)
    client = client_for(team, "operator")
    before = Task.objects.filter(run=run).count()
    for bad in (
        "not json",
        '{"tasks": "nope"}',
        '[{"key": "x", "kind": "tool", "tool": "test.echo", "after": ["missing"]}]',
        "42",
    ):
        response = client.post(f"/runs/{run.pk}/append/", {"tasks": bad}, HTTP_HX_REQUEST="true")
        assert response.status_code == 200 and b'data-outcome="refused"' in response.content, bad
    assert Task.objects.filter(run=run).count() == before
    assert Run.objects.get(pk=run.pk).status == "needs_attention"


def test_it_404s_an_unknown_verb_or_task(team: Team) -> None:
    run = held(team)
    client = client_for(team, "operator")
    assert client.post(f"/runs/{run.pk}/tasks/a/explode/").status_code == 404
    assert client.post(f"/runs/{run.pk}/explode/").status_code == 404
    assert client.post(f"/runs/{run.pk}/tasks/nope/retry/").status_code == 404


def test_it_requires_the_csrf_token(team: Team) -> None:
    run = waiting(team)
    client = Client(enforce_csrf_checks=True)
    client.force_login(team.users["operator"])
    assert client.post(f"/runs/{run.pk}/tasks/r1.1/approve/").status_code == 403
    assert Task.objects.get(run=run, key="r1.1").status == "needs_approval"


@pytest.mark.spec("S9")
def test_it_tells_the_second_answerer_the_question_was_answered(team: Team) -> None:
    run = asking(team)
    client_for(team, "operator").post(f"/runs/{run.pk}/tasks/r1.1/answer/", {"value": "eu-west"}, HTTP_HX_REQUEST="true")
    late = states_second_operator(team).post(f"/runs/{run.pk}/tasks/r1.1/answer/", {"value": "us-east"}, HTTP_HX_REQUEST="true")
    text = late.content.decode()
    assert "Already decided" in text and "answered" in text and team.users["operator"].username in text
    assert Task.objects.get(run=run, key="r1.1").result == {"value": "eu-west"}
