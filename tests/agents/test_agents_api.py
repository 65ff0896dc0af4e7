"""POST /api/v1/agents, /agents/lint, GET /agents and /agents/{name} (F2-F8), and `plugin lint`."""

from __future__ import annotations

import io
import uuid
from pathlib import Path

import pytest
from django.core.management import call_command

from oz0agents.models import AgentVersion
from runs.models import Run
from tests.conftest import Team


def _manifest(name: str, kind: str = "gone") -> str:
    return f"name: {name}\nmodel: script\ntools: [oz.fail]\nfailures:\n  - kind: {kind}\n    description: It is gone\n"


def _name() -> str:
    return f"agent_{uuid.uuid4().hex[:8]}"


@pytest.mark.spec("F2")
def test_it_registers_an_agent_and_versions_changes(team: Team) -> None:
    name = _name()
    status, body = team.api().post("/agents", {"manifest": _manifest(name)})
    assert status == 201 and body == {
        "name": name,
        "workspace": team.slug,
        "version": 1,
        "created": True,
        "warnings": [],
        "canary": None,
    }
    status, body = team.api().post("/agents", {"manifest": _manifest(name)})
    assert status == 201 and body["version"] == 1 and body["created"] is False
    status, body = team.api().post("/agents", {"manifest": _manifest(name, "vanished")})
    assert status == 201 and body["version"] == 2
    status, body = team.api().get(f"/agents/{name}")
    assert status == 200 and body["version"] == 2 and body["versions"] == [2, 1]
    assert body["failures"] == [
        {"kind": "vanished", "description": "It is gone", "retryable": False, "partial": False, "person": False}
    ]
    status, body = team.api().get("/agents")
    assert status == 200 and any(a["name"] == name and a["version"] == 2 and a["workspace"] == team.slug for a in body["items"])


@pytest.mark.spec("F3", "F4", "F5")
def test_it_answers_400_listing_every_error(team: Team) -> None:
    text = f"name: {_name()}\nmodel: script\nfailures:\n  - kind: {'k' * 41}\n    description: {'d' * 201}\n  - kind: timeout\n    description: x\n"
    status, body = team.api().post("/agents", {"manifest": text})
    assert status == 400
    assert body["error"]["key"] == "invalid_manifest"
    fields = [e["field"] for e in body["error"]["errors"]]
    assert fields == ["failures[0].kind", "failures[0].description", "failures[1].kind"]
    assert body["error"]["errors"][0]["line"] == 4
    assert "41 characters" in body["error"]["detail"]
    assert not AgentVersion.objects.filter(manifest_text=text).exists()


@pytest.mark.spec("F8")
def test_it_lints_without_registering(team: Team) -> None:
    name = _name()
    text = f"name: {name}\nmodel: script\ntools: [oz.fail]\n"
    status, body = team.api("viewer").post("/agents/lint", {"manifest": text})
    assert status == 200 and body["errors"] == []
    assert [w["field"] for w in body["warnings"]] == ["tools"]
    status, body = team.api().post("/agents", {"manifest": text})
    assert status == 201 and [w["field"] for w in body["warnings"]] == ["tools"]
    status, body = team.api().post("/agents/lint", {"manifest": "name: x\n"})
    assert status == 200 and [e["field"] for e in body["errors"]] == ["model"]


@pytest.mark.parametrize("role", ["reader", "viewer", "outsider"])
def test_it_needs_operator_standing_to_register(team: Team, role: str) -> None:
    name = _name()
    status, body = team.api(role).post("/agents", {"manifest": _manifest(name)})
    assert status == 403 and body["error"]["key"] == "forbidden"
    assert not AgentVersion.objects.filter(agent__name=name).exists()


def test_it_refuses_anonymous_callers(team: Team) -> None:
    from django.test import Client

    response = Client().post("/api/v1/agents", {"manifest": _manifest(_name())}, content_type="application/json")
    assert response.status_code == 401


def test_it_answers_404_for_an_unknown_agent(team: Team) -> None:
    status, body = team.api().get(f"/agents/{_name()}")
    assert status == 404 and body["error"]["key"] == "not_found"


@pytest.mark.spec("F2")
def test_it_records_the_version_a_run_ran(team: Team) -> None:
    name = _name()
    team.api().post("/agents", {"manifest": _manifest(name)})
    team.api().post("/agents", {"manifest": _manifest(name, "vanished")})
    status, body = team.api().post(f"/workspaces/{team.slug}/runs", {"agent": name, "approval": {"mode": "bypass"}})
    assert status == 201, body
    run = Run.objects.get(pk=body["run"]["id"])
    assert run.agent_version is not None and run.agent_version.version == 2 and run.agent_name == name


@pytest.mark.spec("F8")
def test_it_prints_lint_problems_with_path_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: bad\nmodel: script\ntools: [test.echo]\nfailures:\n  - kind: timeout\n    description: x\n  - kind: fine\n    description: y\n"
    )
    warn = tmp_path / "warn.yaml"
    warn.write_text("name: warn\nmodel: script\ntools: [oz.fail]\n")
    out = io.StringIO()
    with pytest.raises(SystemExit) as exit_info:
        call_command("plugin_lint", str(bad), str(warn), stdout=out, stderr=io.StringIO())
    assert exit_info.value.code == 1
    lines = out.getvalue().splitlines()
    assert f"{bad}:5: error: failures[0].kind: 'timeout' is a platform kind; an agent never declares one (F3)" in lines
    assert any(line.startswith(f"{bad}:4: warning: failures:") for line in lines)
    assert any(line.startswith(f"{warn}:3: warning: tools:") for line in lines)


def test_it_exits_0_when_only_warnings_remain(tmp_path: Path) -> None:
    (tmp_path / "warn.yaml").write_text("name: warn\nmodel: script\ntools: [oz.fail]\n")
    out = io.StringIO()
    call_command("plugin_lint", str(tmp_path), stdout=out, stderr=io.StringIO())
    assert ": warning: " in out.getvalue() and ": error: " not in out.getvalue()


def test_it_warns_about_a_tool_not_installed_yet_and_exits_0(tmp_path: Path) -> None:
    (tmp_path / "later.yaml").write_text("name: later\nmodel: script\ntools: [github.get_issue]\n")
    out = io.StringIO()
    call_command("plugin_lint", str(tmp_path), stdout=out, stderr=io.StringIO())
    assert f"{tmp_path / 'later.yaml'}:3: warning: tools[0]: names 'github.get_issue'" in out.getvalue()
    assert ": error: " not in out.getvalue()


def test_it_prints_an_alias_bomb_as_one_error_with_its_line(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(
        "name: bomb\nmodel: script\nscript:\n  a: &a [x, x, x, x, x, x, x, x, x]\n  b: [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
    )
    out = io.StringIO()
    with pytest.raises(SystemExit):
        call_command("plugin_lint", str(bomb), stdout=out, stderr=io.StringIO())
    assert out.getvalue().splitlines() == [
        f"{bomb}:4: error: manifest: uses a YAML anchor or alias (`&name` / `*name`); manifests refuse them: write the value out in full"
    ]


NINE_LEVEL_BOMB = "name: bomb\nmodel: script\nscript:\n" + "".join(
    f"  l{n}: &l{n} [" + ",".join([f"*l{n - 1}"] * 9 if n else ['"lol"'] * 9) + "]\n" for n in range(9)
)


@pytest.mark.parametrize("path", ["/agents/lint", "/agents"])
def test_it_refuses_an_alias_bomb_at_each_api_door_typed_and_writes_nothing(team: Team, path: str) -> None:
    before = AgentVersion.objects.count()
    status, body = team.api().post(path, {"manifest": NINE_LEVEL_BOMB})
    errors = body["errors"] if path.endswith("lint") else body["error"]["errors"]
    assert status == (200 if path.endswith("lint") else 400), body
    assert [(e["line"], e["field"]) for e in errors] == [(4, "manifest")] and "alias" in errors[0]["message"]
    assert AgentVersion.objects.count() == before


@pytest.mark.parametrize(
    "manifest",
    [
        "name: dated\nmodel: script\nscript: [{text: 2024-01-01}]\n",
        "name: binary\nmodel: script\nscript: [{text: !!binary aGVsbG8=}]\n",
        'name: nul\nmodel: script\ndescription: "a\\0b"\n',
        "name: deep\nmodel: script\nscript: " + "[" * 3000 + "]" * 3000 + "\n",
        "name: huge\nmodel: script\ninstructions: " + "x" * (300 * 1024) + "\n",
    ],
)
def test_it_answers_400_never_500_for_manifests_json_cannot_hold(team: Team, manifest: str) -> None:
    before = AgentVersion.objects.count()
    status, body = team.api().post("/agents", {"manifest": manifest})
    assert status == 400 and body["error"]["key"] == "invalid_manifest", body
    assert body["error"]["errors"][0]["line"] >= 1
    assert AgentVersion.objects.count() == before
    status, body = team.api().post("/agents/lint", {"manifest": manifest})
    assert status == 200 and body["errors"], body
