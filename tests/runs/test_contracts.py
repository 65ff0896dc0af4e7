"""One contract per request shape (issue 28.2): the kernel's compile is a create's and an append's
one validator, so its typed keys reach the client, and write standing is checked once."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest

from runs import kernel, schemas
from runs.models import Run, Task
from tenancy import permissions
from tests.conftest import Team
from tests.runs.driver import echo

# A bad task, and the kernel's own key for it (runs/kernel/compile.py), not ninja's `invalid_request`.
BAD_TASKS: list[tuple[dict[str, Any], str]] = [
    ({"key": "a", "kind": "teleport"}, "invalid_kind"),
    ({"key": "a", "kind": 7}, "invalid_kind"),
    ({"key": "a", "kind": "await", "on_failure": "shrug"}, "invalid_on_failure"),
    ({"key": "a"}, "missing_field"),
    ({"key": ".a", "kind": "await"}, "invalid_key"),
    ({"key": "a", "kind": "await", "after": ["b", "b"]}, "duplicate_after"),
    ({"key": "a", "kind": "await", "question": 5}, "invalid_field"),
    ({"key": "a", "kind": "join", "after": [], "timeout_s": -1}, "invalid_field"),
]


@pytest.mark.spec("S30")
@pytest.mark.parametrize("task,key", BAD_TASKS)
def test_it_answers_a_bad_create_with_the_kernels_key(team: Team, task: dict[str, Any], key: str) -> None:
    status, answer = team.api("operator").post(f"/workspaces/{team.slug}/runs", {"tasks": [task]})
    assert (status, answer["error"]["key"]) == (400, key), answer
    assert not Run.objects.filter(workspace__slug=team.slug).exists()


@pytest.mark.spec("S17", "S30")
@pytest.mark.parametrize("task,key", BAD_TASKS)
def test_it_answers_a_bad_append_with_the_kernels_key(team: Team, task: dict[str, Any], key: str) -> None:
    api = team.api("operator")
    _, created = api.post(f"/workspaces/{team.slug}/runs", {"tasks": [{"key": "q", "kind": "await", "question": "?"}]})
    run_id = created["run"]["id"]
    status, answer = api.post(f"/runs/{run_id}/append", {"tasks": [task]})
    assert (status, answer["error"]["key"]) == (400, key), answer
    assert Task.objects.filter(run_id=run_id).count() == 1


@pytest.mark.spec("S30")
@pytest.mark.parametrize(
    "body,key",
    [
        ({"tasks": [echo("a")], "private": "yes"}, "invalid_field"),
        ({"tasks": {"a": 1}}, "invalid_field"),
        ({"tasks": [echo("a")], "retry": {"budget": 101}}, "invalid_field"),
        ({"tasks": [echo("a")], "approval": {"mode": "never"}}, "invalid_field"),
        ({"tasks": [echo("a")], "surprise": 1}, "unknown_field"),
    ],
)
def test_it_answers_a_bad_create_field_with_the_kernels_key(team: Team, body: dict[str, Any], key: str) -> None:
    status, answer = team.api("operator").post(f"/workspaces/{team.slug}/runs", body)
    assert (status, answer["error"]["key"]) == (400, key), answer


def test_it_refuses_an_unknown_append_field(team: Team) -> None:
    api = team.api("operator")
    _, created = api.post(f"/workspaces/{team.slug}/runs", {"tasks": [{"key": "q", "kind": "await", "question": "?"}]})
    status, answer = api.post(f"/runs/{created['run']['id']}/append", {"tasks": [echo("b")], "surprise": 1})
    assert (status, answer["error"]["key"]) == (400, "unknown_field"), answer


@pytest.mark.spec("S32")
def test_it_checks_write_standing_once_a_create(team: Team) -> None:
    with mock.patch("runs.kernel.access.has_write_standing", wraps=permissions.has_write_standing) as checked:
        status, answer = team.api("operator").post(f"/workspaces/{team.slug}/runs", {"tasks": [echo("a")]})
    assert status == 201, answer
    assert checked.call_count == 1


@pytest.mark.spec("S17", "S32")
def test_it_checks_write_standing_once_an_append(team: Team) -> None:
    api = team.api("operator")
    _, created = api.post(f"/workspaces/{team.slug}/runs", {"tasks": [{"key": "q", "kind": "await", "question": "?"}]})
    with mock.patch("runs.kernel.access.has_write_standing", wraps=permissions.has_write_standing) as checked:
        status, answer = api.post(f"/runs/{created['run']['id']}/append", {"tasks": [echo("b")]})
    assert status == 200, answer
    assert checked.call_count == 1


def test_it_parses_a_create_body_once(team: Team) -> None:
    """The strict parser reads the body, and compile validates it; nothing else walks it."""
    storable = mock.Mock(wraps=kernel.check_storable)
    with (
        mock.patch.object(schemas, "check_storable", storable),
        mock.patch("runs.kernel.compile.check_storable", storable),
        mock.patch("runs.kernel.compile.compile_tasks", wraps=kernel.compile_tasks) as compiled,
    ):
        status, answer = team.api("operator").post(f"/workspaces/{team.slug}/runs", {"tasks": [echo("a")]})
    assert status == 201, answer
    assert (storable.call_count, compiled.call_count) == (1, 1)
