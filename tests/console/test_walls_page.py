"""The Walls section of a workspace's Settings page (issue 31 item 6): operators put walls up,
change who is behind them and take them down; everyone else is refused and nothing changes."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tenancy.models import Wall
from tests.conftest import Team
from tests.insights.planting import make_agent

pytestmark = pytest.mark.django_db


def browser(team: Team, role: str) -> Client:
    client = Client()
    client.force_login(team.users[role])
    return client


@pytest.fixture
def payroll(team: Team) -> str:
    make_agent("payroll", workspace=team.workspace)
    return "payroll"


def test_an_operator_sees_the_section_with_the_agents_and_the_people(team: Team, payroll: str) -> None:
    page = browser(team, "operator").get(f"/w/{team.slug}/settings/").content.decode()
    assert '<section id="walls"' in page and '<option value="payroll">' in page
    assert f'value="{team.users["reader"].username}"' in page and "No walls" in page


@pytest.mark.parametrize("role,expected", [("outsider", 404), ("viewer", 403), ("reader", 403)])
def test_no_one_but_an_operator_puts_a_wall_up_or_takes_one_down(team: Team, payroll: str, role: str, expected: int) -> None:
    client = browser(team, role)
    form = {"agent": payroll, "members": [team.users["reader"].username]}
    assert client.post(f"/w/{team.slug}/settings/walls/", form).status_code == expected
    assert not Wall.objects.exists()
    wall = Wall.objects.create(workspace=team.workspace, agent_name=payroll)
    assert client.post(f"/w/{team.slug}/settings/walls/{wall.pk}/delete/").status_code == expected
    assert Wall.objects.filter(pk=wall.pk).exists()


def test_an_operator_puts_a_wall_up_changes_it_and_takes_it_down_with_htmx(team: Team, payroll: str) -> None:
    client = browser(team, "operator")
    htmx = {"HTTP_HX_REQUEST": "true"}
    reader, viewer = team.users["reader"].username, team.users["viewer"].username
    answer = client.post(f"/w/{team.slug}/settings/walls/", {"agent": payroll, "members": [reader]}, **htmx)
    assert answer.status_code == 200 and "Saved the wall around payroll" in answer.content.decode()
    assert list(Wall.objects.get(agent_name=payroll).members.values_list("username", flat=True)) == [reader]
    changed = client.post(f"/w/{team.slug}/settings/walls/", {"agent": payroll, "members": [viewer]}, **htmx)
    assert changed.status_code == 200 and Wall.objects.count() == 1
    assert list(Wall.objects.get(agent_name=payroll).members.values_list("username", flat=True)) == [viewer]
    wall = Wall.objects.get()
    gone = client.post(f"/w/{team.slug}/settings/walls/{wall.pk}/delete/", **htmx)
    assert gone.status_code == 200 and "No walls" in gone.content.decode() and not Wall.objects.exists()


def test_a_plain_post_is_redirected_back_to_the_settings_page(team: Team, payroll: str) -> None:
    answer = browser(team, "operator").post(f"/w/{team.slug}/settings/walls/", {"agent": payroll, "members": []})
    assert answer.status_code == 302 and answer["Location"] == f"/w/{team.slug}/settings/"


@pytest.mark.parametrize(
    "form,message",
    [
        ({"agent": "Not An Agent"}, "must be an agent"),
        ({"agent": "payroll", "members": ["someone-else-entirely"]}, "not members of this workspace"),
        ({"agent": "x" * 5000}, "must be an agent"),
    ],
)
def test_a_bad_form_answers_400_saying_why_and_writes_nothing(
    team: Team, payroll: str, form: dict[str, Any], message: str
) -> None:
    answer = browser(team, "operator").post(f"/w/{team.slug}/settings/walls/", form, HTTP_HX_REQUEST="true")
    assert answer.status_code == 400 and message in answer.content.decode()
    assert not Wall.objects.exists()


def test_taking_down_a_wall_of_another_workspace_is_404(team: Team, payroll: str) -> None:
    other = Team()
    wall = Wall.objects.create(workspace=other.workspace, agent_name="payroll")
    assert browser(team, "operator").post(f"/w/{team.slug}/settings/walls/{wall.pk}/delete/").status_code == 404
    assert Wall.objects.filter(pk=wall.pk).exists()
