"""The console's Schedules page: the role matrix for the page and each POST, htmx fragments,
typed refusals shown in the form (never a 500), nothing written on a refusal."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from schedules import services
from schedules.models import Schedule, ScheduleEvent
from tests.conftest import Team
from tests.schedules.conftest import schedule_body

HX = {"HTTP_HX_REQUEST": "true"}


def _client(team: Team, role: str) -> Client:
    client = Client()
    client.force_login(team.users[role])
    return client


def _form(agent_name: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": "nightly",
        "agent": agent_name,
        "input": '{"day": "today"}',
        "timing": "cron",
        "cron": "0 3 * * *",
        "timezone": "Europe/Paris",
        "overlap": "skip",
        "catch_up": "1",
        **extra,
    }


def _made(team: Team, agent: str) -> Schedule:
    return services.create(workspace=team.workspace, user=team.users["operator"], body=schedule_body(agent))


def test_it_lists_schedules_with_next_fire_times_and_an_operator_gets_the_form(team: Team, agent: str) -> None:
    _made(team, agent)
    html = _client(team, "operator").get(f"/w/{team.slug}/schedules/").content.decode()
    assert 'data-schedule="nightly"' in html and "<time datetime=" in html
    assert 'id="schedule-form"' in html and 'data-verb="pause"' in html


@pytest.mark.parametrize("role", ["viewer", "reader"])
def test_viewers_and_readers_see_the_list_without_buttons(team: Team, agent: str, role: str) -> None:
    made = _made(team, agent)
    client = _client(team, role)
    response = client.get(f"/w/{team.slug}/schedules/")
    html = response.content.decode()
    assert response.status_code == 200 and 'data-schedule="nightly"' in html
    assert 'id="schedule-form"' not in html and 'data-verb="pause"' not in html
    assert client.post(f"/w/{team.slug}/schedules/new/", _form(agent, name="other")).status_code == 403
    for verb in ("pause", "resume", "delete"):
        assert client.post(f"/w/{team.slug}/schedules/{made.pk}/{verb}/", **HX).status_code == 403
    assert list(Schedule.objects.filter(workspace=team.workspace).values_list("name", "paused")) == [("nightly", False)]
    assert ScheduleEvent.objects.filter(workspace=team.workspace).count() == 1


def test_an_outsider_gets_404_and_anonymous_is_sent_to_sign_in(team: Team, agent: str) -> None:
    made = _made(team, agent)
    outsider = _client(team, "outsider")
    assert outsider.get(f"/w/{team.slug}/schedules/").status_code == 404
    assert outsider.post(f"/w/{team.slug}/schedules/new/", _form(agent, name="x")).status_code == 404
    assert outsider.post(f"/w/{team.slug}/schedules/{made.pk}/pause/").status_code == 404
    anonymous = Client().get(f"/w/{team.slug}/schedules/")
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    assert Client().post(f"/w/{team.slug}/schedules/{made.pk}/delete/").status_code == 302
    assert Schedule.objects.filter(pk=made.pk, paused=False).exists()


def test_the_post_routes_refuse_get(team: Team, agent: str) -> None:
    made = _made(team, agent)
    client = _client(team, "operator")
    assert client.get(f"/w/{team.slug}/schedules/new/").status_code == 405
    for verb in ("pause", "resume", "delete"):
        assert client.get(f"/w/{team.slug}/schedules/{made.pk}/{verb}/").status_code == 405


def test_an_operator_creates_a_schedule_by_htmx_and_by_a_plain_post(team: Team, agent: str) -> None:
    client = _client(team, "operator")
    response = client.post(f"/w/{team.slug}/schedules/new/", _form(agent), **HX)
    html = response.content.decode()
    assert response.status_code == 200 and html.startswith('<div id="schedules"') and "Created nightly." in html
    plain = client.post(f"/w/{team.slug}/schedules/new/", _form(agent, name="hourly", timing="interval", interval_seconds="3600"))
    assert plain.status_code == 302
    made = Schedule.objects.get(workspace=team.workspace, name="hourly")
    assert made.interval_seconds == 3600 and made.cron == "" and made.owner == team.users["operator"]
    assert Schedule.objects.get(workspace=team.workspace, name="nightly").body == {"agent": agent, "input": {"day": "today"}}


@pytest.mark.parametrize(
    ("change", "status", "words"),
    [
        ({"cron": "every tuesday"}, 400, "invalid_cron"),
        ({"timezone": "Mars/Olympus"}, 400, "unknown_timezone"),
        ({"timing": "interval", "interval_seconds": "5"}, 400, "invalid_interval"),
        ({"timing": "interval", "interval_seconds": "soon"}, 400, "invalid_interval"),
        ({"input": "{not json"}, 400, "invalid_json"),
        ({"input": "[" * 400 + "]" * 400}, 400, "too_deep"),
        ({"input": '"' + "x" * 70000 + '"'}, 413, "payload_too_large"),
        ({"agent": "no-such-agent"}, 400, ""),
        ({"catch_up": "many"}, 400, "invalid_catch_up"),
        ({"name": "bad name!"}, 400, "invalid_name"),
        ({"overlap": "explode"}, 400, "invalid_overlap"),
    ],
)
def test_bad_form_input_is_refused_in_the_form_and_writes_nothing(
    team: Team, agent: str, change: dict[str, Any], status: int, words: str
) -> None:
    client = _client(team, "operator")
    response = client.post(f"/w/{team.slug}/schedules/new/", _form(agent, **change), **HX)
    assert response.status_code == status and response["HX-Retarget"] == "#toasts"
    assert 'data-outcome="refused"' in response.content.decode() and words in response.content.decode()
    # Without htmx: the page, with the refusal in the form's place and the form as typed.
    response = client.post(f"/w/{team.slug}/schedules/new/", _form(agent, **change))
    html = response.content.decode()
    assert response.status_code == status
    assert 'role="alert"' in html and words in html and 'id="schedule-form"' in html
    assert not Schedule.objects.filter(workspace=team.workspace).exists()


def test_an_operator_pauses_resumes_and_deletes(team: Team, agent: str) -> None:
    made = _made(team, agent)
    client = _client(team, "operator")
    html = client.post(f"/w/{team.slug}/schedules/{made.pk}/pause/", **HX).content.decode()
    assert "Paused nightly." in html and 'data-paused="true"' in html
    refused = client.post(f"/w/{team.slug}/schedules/{made.pk}/pause/", **HX)
    assert refused.status_code == 409 and refused["HX-Retarget"] == "#toasts"
    html = client.post(f"/w/{team.slug}/schedules/{made.pk}/resume/", **HX).content.decode()
    assert "Resumed nightly." in html and 'data-paused="false"' in html
    assert client.post(f"/w/{team.slug}/schedules/{made.pk}/delete/").status_code == 302
    assert not Schedule.objects.filter(pk=made.pk).exists()
    assert client.post(f"/w/{team.slug}/schedules/{made.pk}/delete/", **HX).status_code == 404
    verbs = list(ScheduleEvent.objects.filter(workspace=team.workspace).order_by("id").values_list("verb", flat=True))
    assert verbs == ["created", "paused", "resumed", "deleted"]
