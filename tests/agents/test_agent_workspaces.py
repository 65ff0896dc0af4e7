"""Agents belong to a workspace: who may register, lint and read them, and how a run's `agent` resolves."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.test import Client

from oz0agents.models import Agent, AgentVersion
from runs.models import Run
from tenancy.models import Membership
from tests.conftest import Api, Team
from tests.factories import make_token


def _name() -> str:
    return f"agent_{uuid.uuid4().hex[:8]}"


def _manifest(name: str, *, approval: str = "ask", instructions: str = "Deploy carefully.") -> str:
    return (
        f"name: {name}\nmodel: script\ninstructions: {instructions}\ntools: [clock.now]\n"
        f"approval: {approval}\nscript:\n  - text: deployed\n"
    )


def _also_operator_of(team: Team, other: Team) -> Api:
    """The team's operator, made an operator of `other` too."""
    Membership.objects.create(workspace=other.workspace, user=team.users["operator"], role="operator")
    return team.api()


@pytest.mark.spec("S32")
def test_it_keeps_another_workspaces_operator_from_changing_an_agent_it_runs(team: Team) -> None:
    """Before, agents were global: any operator anywhere could register `approval: bypass` over another workspace's agent."""
    victim, attacker = team, Team()
    name = _name()
    status, body = victim.api().post("/agents", {"manifest": _manifest(name, instructions="Deploy carefully.")})
    assert status == 201 and body["workspace"] == victim.slug

    # The attacker names the victim's workspace: not a member there, so there is nothing to see.
    status, body = attacker.api().post("/agents", {"manifest": _manifest(name, approval="bypass"), "workspace": victim.slug})
    assert status == 404 and body["error"]["key"] == "not_found"
    status, body = attacker.api().post(f"/workspaces/{victim.slug}/agents", {"manifest": _manifest(name, approval="bypass")})
    assert status == 404
    # Without a workspace the manifest registers in the attacker's own workspace: a different agent.
    status, body = attacker.api().post("/agents", {"manifest": _manifest(name, approval="bypass", instructions="Leak it all.")})
    assert status == 201 and body["workspace"] == attacker.slug and body["version"] == 1

    status, created = victim.api().post(f"/workspaces/{victim.slug}/runs", {"agent": name})
    assert status == 201, created
    run = Run.objects.select_related("agent_version__agent").get(pk=created["run"]["id"])
    assert run.agent_version is not None and run.agent_version.agent.workspace_id == victim.workspace.pk
    assert run.approval["mode"] == "ask"
    assert run.agent_version.manifest["instructions"] == "Deploy carefully."
    assert AgentVersion.objects.filter(agent__workspace=victim.workspace, agent__name=name).count() == 1


@pytest.mark.parametrize("role", ["viewer", "reader"])
def test_it_needs_operator_standing_in_the_agents_workspace(team: Team, role: str) -> None:
    other = Team()
    Membership.objects.create(workspace=other.workspace, user=team.users["operator"], role=role)
    name = _name()
    status, body = team.api().post("/agents", {"manifest": _manifest(name), "workspace": other.slug})
    assert status == 403 and body["error"]["key"] == "forbidden"
    assert not Agent.objects.filter(name=name).exists()


def test_it_registers_in_the_one_workspace_an_operator_operates_and_asks_when_there_are_several(team: Team) -> None:
    name = _name()
    status, body = team.api().post("/agents", {"manifest": _manifest(name)})
    assert status == 201 and body["workspace"] == team.slug
    other = Team()
    api = _also_operator_of(team, other)
    status, body = api.post("/agents", {"manifest": _manifest(_name())})
    assert status == 400 and body["error"]["key"] == "workspace_required"
    status, body = api.post("/agents", {"manifest": _manifest(name), "workspace": other.slug})
    assert status == 201 and body == {**body, "workspace": other.slug, "version": 1, "created": True}
    status, body = api.post(f"/workspaces/{team.slug}/agents", {"manifest": _manifest(name, approval="bypass")})
    assert status == 201 and body["workspace"] == team.slug and body["version"] == 2


def test_it_resolves_a_runs_agent_within_the_runs_workspace(team: Team) -> None:
    other = Team()
    name = _name()
    assert other.api().post("/agents", {"manifest": _manifest(name)})[0] == 201
    status, body = team.api().post(f"/workspaces/{team.slug}/runs", {"agent": name})
    assert status == 400 and body["error"]["key"] == "unknown_agent"
    assert not Run.objects.filter(workspace=team.workspace).exists()


@pytest.mark.parametrize(
    "role,status,words",
    [("operator", 200, True), ("reader", 200, True), ("viewer", 200, False), ("outsider", 404, False)],
)
def test_it_shows_an_agents_words_only_to_those_who_may_read_content(team: Team, role: str, status: int, words: bool) -> None:
    name = _name()
    team.api().post("/agents", {"manifest": _manifest(name, instructions="The launch code is 0000.")})
    for path in (f"/agents/{name}", f"/workspaces/{team.slug}/agents/{name}"):
        got, body = team.api(role).get(path)
        assert got == status, body
        if status != 200:
            assert body["error"]["key"] == "not_found"
            continue
        assert body["workspace"] == team.slug and body["tools"] == ["clock.now"] and body["approval"]["mode"] == "ask"
        assert body["content_visible"] is words
        assert ("The launch code is 0000." in str(body)) is words
        if not words:
            assert body["instructions"] is None and body["manifest"] is None


@pytest.mark.parametrize("role", ["operator", "reader", "viewer", "outsider"])
def test_it_lists_only_the_agents_of_the_callers_workspaces(team: Team, role: str) -> None:
    ours, theirs = _name(), _name()
    team.api().post("/agents", {"manifest": _manifest(ours)})
    other = Team()
    other.api().post("/agents", {"manifest": _manifest(theirs)})
    status, body = team.api(role).get("/agents")
    names = {a["name"] for a in body["items"]}
    assert status == 200 and theirs not in names
    assert (ours in names) is (role != "outsider")
    status, body = team.api(role).get(f"/workspaces/{team.slug}/agents")
    assert status == (404 if role == "outsider" else 200)
    status, body = team.api(role).get(f"/workspaces/{other.slug}/agents")
    assert status == 404
    status, body = team.api(role).get(f"/agents/{theirs}")
    assert status == 404


def test_it_asks_which_workspace_when_two_of_yours_have_the_agent(team: Team) -> None:
    other = Team()
    name = _name()
    team.api().post("/agents", {"manifest": _manifest(name)})
    other.api().post("/agents", {"manifest": _manifest(name, instructions="Theirs.")})
    api = _also_operator_of(team, other)
    status, body = api.get(f"/agents/{name}")
    assert status == 400 and body["error"]["key"] == "workspace_required"
    status, body = api.get(f"/agents/{name}?workspace={other.slug}")
    assert status == 200 and body["instructions"] == "Theirs."
    status, body = api.get("/agents")
    assert sorted(a["workspace"] for a in body["items"] if a["name"] == name) == sorted([team.slug, other.slug])


@pytest.mark.parametrize("role,status", [("operator", 200), ("reader", 200), ("viewer", 200), ("outsider", 403)])
def test_it_lints_only_for_members_of_a_workspace(team: Team, role: str, status: int) -> None:
    """Before, any signed-in user could lint (and so probe the installed tools)."""
    got, body = team.api(role).post("/agents/lint", {"manifest": "name: x\nmodel: script\n"})
    assert got == status, body
    if status == 403:
        assert body["error"]["key"] == "forbidden"
    got, body = team.api(role).post("/agents/lint", {"manifest": "name: x\nmodel: script\n", "workspace": team.slug})
    assert got == (404 if role == "outsider" else 200)
    got, body = team.api(role).post("/agents/lint", {"manifest": "name: x\nmodel: script\n", "workspace": Team().slug})
    assert got == 404


def test_it_refuses_huge_and_malformed_bodies_typed(team: Team) -> None:
    api = team.api()
    status, body = api.post("/agents", raw="{not json")
    assert status == 400 and "key" in body["error"]
    status, body = api.post("/agents", {"manifest": _manifest(_name()), "workspace": 7})
    assert status == 400 and body["error"]["key"] == "invalid_request"
    status, body = api.post("/agents", {"manifest": "x" * (2 * 1024 * 1024)})
    assert status == 413 and "key" in body["error"]
    status, body = api.post("/agents/lint", {"manifest": "x" * (2 * 1024 * 1024)})
    assert status == 413
    status, body = api.get(f"/agents/{'n' * 5000}")
    assert status == 404
    assert not Agent.objects.filter(workspace=team.workspace).exists()


def test_it_refuses_anonymous_callers_everywhere(team: Team) -> None:
    client = Client()
    for method, path in (
        ("post", "/api/v1/agents/lint"),
        ("post", f"/api/v1/workspaces/{team.slug}/agents"),
        ("get", f"/api/v1/workspaces/{team.slug}/agents"),
        ("get", "/api/v1/agents"),
    ):
        response = getattr(client, method)(path, {"manifest": "x"} if method == "post" else None, content_type="application/json")
        assert response.status_code == 401, path


@pytest.mark.spec("F13")
def test_it_lists_the_callers_agents_in_the_catalog_and_the_openapi_document(team: Team) -> None:
    ours, theirs = _name(), _name()
    failing = "\ntools: [oz.fail]\nfailures:\n  - kind: gone\n    description: It is gone\n"
    team.api().post("/agents", {"manifest": f"name: {ours}\nmodel: script" + failing})
    other = Team()
    other.api().post("/agents", {"manifest": f"name: {theirs}\nmodel: script" + failing})

    status, catalog = team.api("viewer").get("/catalog")
    listed = {(a["name"], a["workspace"]) for a in catalog["agents"]}
    assert status == 200 and (ours, team.slug) in listed and all(name != theirs for name, _ in listed)

    status, document = team.api("viewer").get("/openapi.json")
    assert status == 200 and document["x-oz0-failures"][ours] == ["gone"] and theirs not in document["x-oz0-failures"]
    anonymous = Client().get("/api/v1/openapi.json").json()
    assert ours not in anonymous["x-oz0-failures"] and theirs not in anonymous["x-oz0-failures"]

    # A name two of the caller's workspaces use is qualified by workspace.
    other.api().post("/agents", {"manifest": f"name: {ours}\nmodel: script" + failing})
    Membership.objects.create(workspace=other.workspace, user=team.users["viewer"], role="viewer")
    viewer = Api(make_token(user=team.users["viewer"]))
    status, document = viewer.get("/openapi.json")
    kinds = document["x-oz0-failures"]
    assert ours not in kinds and kinds[f"{team.slug}/{ours}"] == ["gone"] and kinds[f"{other.slug}/{ours}"] == ["gone"]


@pytest.mark.spec("F13")
# Committed as it goes, not one transaction held open across the document's build: on a loaded
# CI machine the build outlasted the database's idle-in-transaction bound (30 s) and the server
# ended the test's session.
@pytest.mark.django_db(transaction=True)
def test_the_openapi_document_is_built_once_a_process_and_each_caller_still_gets_their_own_kinds(
    team: Team, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anyone may fetch the document, signed in or not, and building it took about half a second
    of the web process's CPU each time. It is built once a process; only its failure kinds are
    the caller's, and one caller's kinds never reach the next (the shared document is not written)."""
    from ninja import NinjaAPI

    from oz0site.api import api

    builds: list[dict[str, Any]] = []
    build = NinjaAPI.get_openapi_schema

    def counted(self: NinjaAPI, **kwargs: Any) -> Any:
        builds.append(kwargs)
        return build(self, **kwargs)

    monkeypatch.setattr(NinjaAPI, "get_openapi_schema", counted)
    monkeypatch.setattr(api, "_built", {}, raising=False)
    ours = _name()
    failing = "\ntools: [oz.fail]\nfailures:\n  - kind: gone\n    description: It is gone\n"
    assert team.api().post("/agents", {"manifest": f"name: {ours}\nmodel: script" + failing})[0] == 201

    anonymous = Client().get("/api/v1/openapi.json").json()
    status, member = team.api("viewer").get("/openapi.json")
    assert status == 200 and member["x-oz0-failures"][ours] == ["gone"] and member["info"]["x-oz0-failures"][ours] == ["gone"]
    assert Client().get("/api/v1/openapi.json").json() == anonymous
    assert ours not in anonymous["x-oz0-failures"] and ours not in anonymous["info"]["x-oz0-failures"]
    assert member["paths"] == anonymous["paths"] and member["components"] == anonymous["components"]
    assert len(builds) == 1, builds
    (shared,) = api._built.values()
    assert "x-oz0-failures" not in shared and shared["info"]["x-oz0-failures"] == {}
