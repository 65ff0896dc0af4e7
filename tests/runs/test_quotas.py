"""Per-workspace quotas (issue 27.4): runs not finished, tasks in one run, stored input bytes. Each
is tried at its exact limit: the limit is accepted, one past it refused typed (`quota_exceeded`
naming the quota) and nothing changed by the refusal. The Settings page shows them to operators."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client, override_settings

from runs import kernel
from runs.models import Run, Task, TraceEvent
from tenancy.models import Workspace
from tests.conftest import Team

pytestmark = pytest.mark.usefixtures("no_dispatch")


def _await(key: str = "q") -> dict[str, Any]:
    return {"key": key, "kind": "await", "question": "?"}


def _create(team: Team, body: dict[str, Any]) -> tuple[int, Any]:
    return team.api().post(f"/workspaces/{team.workspace.slug}/runs", body)


def _state(team: Team) -> tuple[int, int, int, int]:
    workspace = Workspace.objects.get(pk=team.workspace.pk)
    return (
        Run.objects.filter(workspace=workspace).count(),
        Task.objects.filter(run__workspace=workspace).count(),
        TraceEvent.objects.filter(run__workspace=workspace).count(),
        workspace.stored_input_bytes,
    )


def _refused(answer: Any, quota: str, limit: int) -> None:
    assert answer["error"]["key"] == "quota_exceeded", answer
    assert (answer["error"]["quota"], answer["error"]["limit"]) == (quota, limit)


@override_settings(OZ0_QUOTA_ACTIVE_RUNS=3)
def test_active_runs_at_the_limit_and_one_past(team: Team) -> None:
    """Before, nothing bounded a workspace's runs: 99 runs of 1 MiB inputs in 12 s."""
    for _ in range(3):
        assert _create(team, {"tasks": [_await()]})[0] == 201
    before = _state(team)
    status, answer = _create(team, {"tasks": [_await()]})
    assert status == 429
    _refused(answer, "active_runs", 3)
    assert _state(team) == before
    # Another workspace has its own quota; a finished run frees a place.
    other = Team()
    assert _create(other, {"tasks": [_await()]})[0] == 201
    run = Run.objects.filter(workspace=team.workspace).first()
    assert run is not None
    assert team.api().post(f"/runs/{run.pk}/cancel", {"reason": "done"})[0] == 200
    assert Run.objects.get(pk=run.pk).status == "canceled"
    assert _create(team, {"tasks": [_await()]})[0] == 201


@override_settings(OZ0_QUOTA_TASKS_PER_RUN=4)
def test_tasks_per_run_at_the_limit_and_one_past_on_create_and_append(team: Team) -> None:
    status, answer = _create(team, {"tasks": [_await(f"a{i}") for i in range(5)]})
    assert status == 403
    _refused(answer, "tasks_per_run", 4)
    assert _state(team) == (0, 0, 0, 0)
    status, created = _create(team, {"tasks": [_await(f"a{i}") for i in range(3)]})
    assert status == 201
    run_id = created["run"]["id"]
    before = _state(team)
    status, answer = team.api().post(f"/runs/{run_id}/append", {"tasks": [_await("b1"), _await("b2")]})
    assert status == 403
    _refused(answer, "tasks_per_run", 4)
    assert _state(team) == before
    status, _ = team.api().post(f"/runs/{run_id}/append", {"tasks": [_await("b1")]})
    assert status == 200
    assert Task.objects.filter(run_id=run_id).count() == 4
    status, answer = team.api().post(f"/runs/{run_id}/append", {"tasks": [_await("b2")]})
    assert status == 403
    _refused(answer, "tasks_per_run", 4)


def test_input_bytes_at_the_limit_and_one_past(team: Team) -> None:
    first, second = {"text": "x" * 100}, "y" * 50
    limit = kernel.input_bytes(first) + kernel.input_bytes(second)
    with override_settings(OZ0_QUOTA_INPUT_BYTES=limit):
        assert _create(team, {"input": first, "tasks": [_await()]})[0] == 201
        assert _create(team, {"input": second, "tasks": [_await()]})[0] == 201  # exactly the limit
        assert _state(team)[3] == limit
        before = _state(team)
        status, answer = _create(team, {"input": "z", "tasks": [_await()]})
        assert status == 403
        _refused(answer, "input_bytes", limit)
        assert _state(team) == before
        # A run without an input stores none.
        assert _create(team, {"tasks": [_await()]})[0] == 201


def test_the_defaults_are_far_from_a_small_teams_work() -> None:
    limits = kernel.quota_limits()
    assert limits["active_runs"] >= 1000
    assert limits["tasks_per_run"] >= 10_000
    assert limits["input_bytes"] >= 1024**3


@pytest.mark.parametrize(("role", "status"), [("outsider", 404), ("viewer", 403), ("reader", 403), ("operator", 200)])
def test_the_settings_page_shows_the_quotas_to_operators(team: Team, role: str, status: int) -> None:
    _create(team, {"input": "abc", "tasks": [_await()]})
    client = Client()
    client.force_login(team.users[role])
    response = client.get(f"/w/{team.workspace.slug}/settings/")
    assert response.status_code == status
    if status == 200:
        page = response.content.decode()
        for quota in ("active_runs", "tasks_per_run", "input_bytes"):
            assert f'id="quota-{quota}"' in page
        assert "1 runs" in page and "5 bytes" in page
        fragment = client.get(f"/w/{team.workspace.slug}/settings/", HTTP_HX_REQUEST="true")
        assert fragment.status_code == 200 and "<html" not in fragment.content.decode()
        assert 'id="quota-input_bytes"' in fragment.content.decode()
        assert response["Vary"].count("HX-Request") == 1
    elif status == 403:
        assert "operator" in response.content.decode()


def test_only_operators_see_the_settings_link(team: Team) -> None:
    for role, shown in (("operator", True), ("viewer", False)):
        client = Client()
        client.force_login(team.users[role])
        page = client.get(f"/w/{team.workspace.slug}/audit/").content.decode()
        assert (f"/w/{team.workspace.slug}/settings/" in page) == shown


def test_a_post_to_the_settings_page_is_refused(team: Team) -> None:
    client = Client()
    client.force_login(team.users["operator"])
    assert client.post(f"/w/{team.workspace.slug}/settings/").status_code == 405
