"""A private run's runner calls go only to executors its creator registered (F11, S8)."""

from __future__ import annotations

from typing import Any

import pytest

from runs.models import Task
from tenancy.models import Membership
from tests.conftest import Api, Team
from tests.factories import make_member, make_token


def _executor(api: Api, **extra: Any) -> tuple[str, Api]:
    status, body = api.post("/executors", {"tools": ["test.remote"], **extra})
    assert status == 201, body
    return body["id"], Api(body["token"])


def _private_run(api: Api, slug: str, secret: str, *, private: bool = True) -> str:
    body = {"tasks": [{"key": "a", "kind": "tool", "tool": "test.remote", "args": {"id": secret}}], "private": private}
    status, created = api.post(f"/workspaces/{slug}/runs", body)
    assert status == 201, created
    return str(created["run"]["id"])


def _second_operator(team: Team) -> Api:
    return Api(make_token(user=make_member(workspace=team.workspace, role="operator")))


@pytest.mark.spec("F11", "S8")
def test_it_hands_a_private_runs_call_only_to_its_creators_executors(team: Team) -> None:
    """Before, claim_call filtered by tool and workspace only: another operator's runner got the private args."""
    colleague = _second_operator(team)
    theirs_id, theirs = _executor(colleague)
    run_id = _private_run(team.api(), team.slug, "SECRET-ARGS-1")
    status, body = theirs.post(f"/executors/{theirs_id}/claim")
    assert status == 204, body
    # Even addressed to it by name.
    addressed = _private_run(team.api(), team.slug, "SECRET-ARGS-2")
    Task.objects.filter(run_id=addressed, key="a").update(
        spec={"tool": "test.remote", "args": {"id": "x", "executor": theirs_id}}
    )
    assert theirs.post(f"/executors/{theirs_id}/claim")[0] == 204

    ours_id, ours = _executor(team.api())
    status, call = ours.post(f"/executors/{ours_id}/claim")
    assert status == 200 and call["run"] == run_id and call["args"] == {"id": "SECRET-ARGS-1"}


def test_it_still_shares_a_shared_runs_calls_with_every_operators_executor(team: Team) -> None:
    colleague = _second_operator(team)
    theirs_id, theirs = _executor(colleague)
    run_id = _private_run(team.api(), team.slug, "shared", private=False)
    status, call = theirs.post(f"/executors/{theirs_id}/claim")
    assert status == 200 and call["run"] == run_id


def test_it_fails_a_private_call_when_its_creators_last_executor_is_revoked(team: Team) -> None:
    colleague = _second_operator(team)
    _executor(colleague)  # serves test.remote, but may never take the private call
    ours_id, _ = _executor(team.api())
    shared_id = _private_run(colleague, team.slug, "shared", private=False)
    private_id = _private_run(team.api(), team.slug, "mine")
    status, body = team.api().call("DELETE", f"/executors/{ours_id}")
    assert status == 200 and body["failed_calls"] == 1
    private_call = Task.objects.get(run_id=private_id, key="a")
    assert (private_call.status, private_call.error_key) == ("failed", "executor_revoked")
    # The shared run's call still has a live executor to go to.
    assert Task.objects.get(run_id=shared_id, key="a").status == "dispatched"


def test_it_keeps_a_former_operators_executor_from_private_calls(team: Team) -> None:
    ours_id, ours = _executor(team.api())
    _private_run(team.api(), team.slug, "mine")
    Membership.objects.filter(user=team.users["operator"], workspace=team.workspace).update(role="viewer")
    assert ours.post(f"/executors/{ours_id}/claim")[0] == 204


@pytest.mark.spec("F11", "S8")
def test_it_fails_a_private_call_unserved_when_only_someone_elses_executor_is_live(team: Team, settings: Any) -> None:
    """The unserved sweep reads the claim rule: a colleague's live runner cannot take a private
    run's call, so the call fails `tool_not_served` instead of waiting on it forever."""
    from datetime import timedelta

    from django.utils import timezone

    from runs.kernel import sweep_unserved_calls
    from runs.models import Executor

    settings.OZ0_UNSERVED_SECONDS = 60
    colleague = _second_operator(team)
    theirs_id, _ = _executor(colleague)
    private_id = _private_run(team.api(), team.slug, "p")
    shared_id = _private_run(team.api(), team.slug, "s", private=False)
    later = timezone.now() + timedelta(seconds=120)
    Executor.objects.filter(pk=theirs_id).update(last_heartbeat_at=later - timedelta(seconds=5))
    assert sweep_unserved_calls(later) == 1
    private_task = Task.objects.get(run_id=private_id, key="a")
    assert (private_task.status, private_task.error_key) == ("failed", "tool_not_served")
    assert Task.objects.get(run_id=shared_id, key="a").status == "dispatched"
