"""Walls (F11, issue 31 item 6): a workspace's operators close one agent's runs' words to named
members. Behind the wall a member sees kinds, flags and the fixed sentence, never words, on every
surface the one redaction rule (`runs.permissions`) decides for."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from runs.models import Run
from runs.permissions import can_read_content, content_readable
from tenancy.models import Wall
from tests.conftest import Team
from tests.factories import make_member

pytestmark = pytest.mark.django_db


def wall(team: Team, agent: str, *members: str) -> tuple[int, Any]:
    return team.api("operator").post(
        f"/workspaces/{team.slug}/walls", {"agent": agent, "members": [team.users[m].username for m in members]}
    )


@pytest.mark.spec("F11")
@pytest.mark.parametrize("role", ["viewer", "reader", "operator"])
@pytest.mark.parametrize("own", [False, True])
def test_a_wall_closes_its_agents_runs_to_its_members_only_and_the_filter_agrees(team: Team, role: str, own: bool) -> None:
    user = team.users[role]
    creator = user if own else make_member(workspace=team.workspace, role="operator")
    walled = Run.objects.create(workspace=team.workspace, created_by=creator, agent_name="payroll")
    other = Run.objects.create(workspace=team.workspace, created_by=creator, agent_name="triage")
    agentless = Run.objects.create(workspace=team.workspace, created_by=creator)
    before = can_read_content(user, walled)
    assert wall(team, "payroll", role)[0] == 201
    user = type(user).objects.get(pk=user.pk)  # a new request: no cached walls
    for run, readable in ((walled, False), (other, role != "viewer"), (agentless, role != "viewer")):
        assert can_read_content(user, run) is readable, run.agent_name
        assert Run.objects.filter(content_readable(user), pk=run.pk).exists() is readable
    assert before is (role != "viewer")  # the wall, not the role, closed it
    # Someone else in the same role, not behind the wall, still reads it.
    colleague = make_member(workspace=team.workspace, role=role)
    assert can_read_content(colleague, walled) is (role != "viewer")


@pytest.mark.spec("F11", "F12")
def test_behind_a_wall_a_reader_gets_kinds_flags_and_the_fixed_sentence(team: Team) -> None:
    api = team.api("operator")
    status, created = api.post(
        f"/workspaces/{team.slug}/runs",
        {
            "tasks": [{"key": "f", "kind": "tool", "tool": "test.fail", "args": {"detail": "SECRET-PAYROLL-DETAIL"}}],
            "input": {"note": "SECRET-INPUT"},
        },
    )
    assert status == 201, created
    Run.objects.filter(pk=created["run"]["id"]).update(agent_name="payroll")
    readable = json.dumps(team.api("reader").get(f"/runs/{created['run']['id']}")[1])
    assert "SECRET-INPUT" in readable
    wall(team, "payroll", "reader")
    closed = json.dumps(team.api("reader").get(f"/runs/{created['run']['id']}")[1])
    assert "SECRET-INPUT" not in closed and "SECRET-PAYROLL-DETAIL" not in closed
    assert "SECRET-INPUT" in json.dumps(team.api("operator").get(f"/runs/{created['run']['id']}")[1])


@pytest.mark.parametrize("role,expected", [("outsider", 404), ("viewer", 200), ("reader", 200), ("operator", 200)])
def test_every_member_may_list_the_walls_and_an_outsider_finds_no_workspace(team: Team, role: str, expected: int) -> None:
    wall(team, "payroll", "reader")
    status, body = team.api(role).get(f"/workspaces/{team.slug}/walls")
    assert status == expected
    if status == 200:
        assert [(w["agent"], w["members"]) for w in body["items"]] == [("payroll", [team.users["reader"].username])]


@pytest.mark.parametrize("role,expected", [("outsider", 404), ("viewer", 403), ("reader", 403), ("operator", 201)])
def test_only_an_operator_puts_a_wall_up(team: Team, role: str, expected: int) -> None:
    status, body = team.api(role).post(f"/workspaces/{team.slug}/walls", {"agent": "payroll", "members": []})
    assert status == expected, body
    assert Wall.objects.filter(workspace=team.workspace).exists() is (expected == 201)


@pytest.mark.parametrize("role,expected", [("outsider", 404), ("viewer", 403), ("reader", 403), ("operator", 200)])
def test_only_an_operator_changes_a_walls_members(team: Team, role: str, expected: int) -> None:
    _, made = wall(team, "payroll", "reader")
    status, body = team.api(role).call(
        "PUT", f"/workspaces/{team.slug}/walls/{made['id']}", {"members": [team.users["viewer"].username]}
    )
    assert status == expected, body
    members = list(Wall.objects.get(pk=made["id"]).members.values_list("username", flat=True))
    assert members == [team.users["viewer" if expected == 200 else "reader"].username]


@pytest.mark.parametrize("role,expected", [("outsider", 404), ("viewer", 403), ("reader", 403), ("operator", 204)])
def test_only_an_operator_takes_a_wall_down(team: Team, role: str, expected: int) -> None:
    _, made = wall(team, "payroll", "reader")
    status, _ = team.api(role).call("DELETE", f"/workspaces/{team.slug}/walls/{made['id']}")
    assert status == expected
    assert Wall.objects.filter(pk=made["id"]).exists() is (expected != 204)


def test_a_second_wall_around_one_agent_is_a_conflict(team: Team) -> None:
    assert wall(team, "payroll", "reader")[0] == 201
    status, body = wall(team, "payroll", "viewer")
    assert (status, body["error"]["key"]) == (409, "wall_exists")
    assert Wall.objects.get(workspace=team.workspace).members.count() == 1


@pytest.mark.parametrize(
    "body,key",
    [
        ({"members": []}, "invalid_agent"),
        ({"agent": "Payroll", "members": []}, "invalid_agent"),
        ({"agent": "a" * 101, "members": []}, "invalid_agent"),
        ({"agent": ["payroll"], "members": []}, "invalid_agent"),
        ({"agent": "payroll"}, "invalid_members"),
        ({"agent": "payroll", "members": "reader"}, "invalid_members"),
        ({"agent": "payroll", "members": [1, 2]}, "invalid_members"),
        ({"agent": "payroll", "members": [{"name": "x"}]}, "invalid_members"),
        ({"agent": "payroll", "members": ["nobody-at-all"]}, "not_a_member"),
        ({"agent": "payroll", "members": [f"u{i}" for i in range(501)]}, "too_many_members"),
        ({"agent": "payroll", "members": [], "scope": "all"}, "unknown_field"),
        ([], "invalid_request"),
    ],
)
def test_bad_walls_are_typed_refusals_that_write_nothing(team: Team, body: Any, key: str) -> None:
    status, answer = team.api("operator").post(f"/workspaces/{team.slug}/walls", body)
    assert status == 400 and answer["error"]["key"] == key, answer
    assert not Wall.objects.exists()


def test_a_member_of_another_workspace_cannot_be_walled_and_a_wall_of_another_is_not_found(team: Team) -> None:
    elsewhere = Team()
    status, answer = team.api("operator").post(
        f"/workspaces/{team.slug}/walls", {"agent": "payroll", "members": [elsewhere.users["reader"].username]}
    )
    assert (status, answer["error"]["key"]) == (400, "not_a_member")
    _, made = wall(elsewhere, "payroll", "reader")
    assert team.api("operator").call("DELETE", f"/workspaces/{team.slug}/walls/{made['id']}")[0] == 404
    assert team.api("operator").call("PUT", f"/workspaces/{team.slug}/walls/{made['id']}", {"members": []})[0] == 404
    assert Wall.objects.filter(pk=made["id"]).exists()


@pytest.mark.spec("F11")
def test_the_inbox_tells_a_walled_operator_why_the_words_are_hidden_and_keeps_the_call_from_them(team: Team) -> None:
    from tests.insights.planting import plant

    planted = plant(team, private=False, tag="W")
    wall(team, planted.agent, "operator")
    status, inbox = team.api("operator").get(f"/inbox?workspace={team.slug}&kind=approval")
    assert status == 200
    mine = [item for item in inbox["items"] if item.get("agent") == planted.agent]
    assert mine and all(item["walled"] == planted.agent and not item["actionable"] and "args" not in item for item in mine)
    console = Client()
    console.force_login(team.users["operator"])
    page = console.get(f"/w/{team.slug}/inbox/").content.decode()
    assert f"a wall around {planted.agent} closes its runs" in page
    assert not [secret for secret in planted.secrets.values() if secret in page]
