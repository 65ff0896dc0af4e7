"""The executor API: register, claim under a lease, heartbeat, result, revoke, lease expiry (S8, S10)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from runs.kernel import sweep_expired_leases
from runs.models import Executor, Run, Task
from tests.conftest import Api, Team
from tests.factories import make_member, make_token, make_workspace


def _register(team: Team, tools: list[str] | None = None, role: str = "operator", **extra: Any) -> tuple[int, Any]:
    return team.api(role).post("/executors", {"tools": ["test.remote"] if tools is None else tools, **extra})


def _executor(team: Team, tools: list[str] | None = None, **extra: Any) -> tuple[str, Api]:
    status, body = _register(team, tools, **extra)
    assert status == 201, body
    return body["id"], Api(body["token"])


def _run(team: Team, tasks: list[dict[str, Any]], deliverable: str | None = None) -> str:
    body: dict[str, Any] = {"tasks": tasks}
    if deliverable:
        body["deliverable"] = deliverable
    status, created = team.api().post(f"/workspaces/{team.slug}/runs", body)
    assert status == 201, created
    return str(created["run"]["id"])


def _remote(key: str = "a", **args: Any) -> dict[str, Any]:
    return {"key": key, "kind": "tool", "tool": "test.remote", "args": {"id": key, **args}}


def _task(run_id: str, key: str) -> Task:
    return Task.objects.get(run_id=run_id, key=key)


@pytest.mark.spec("S8")
def test_it_advertises_a_runner_call_and_hands_it_out_once(team: Team) -> None:
    run_id = _run(team, [_remote("a")])
    task = _task(run_id, "a")
    assert (task.status, task.claim) == ("dispatched", None)
    executor_id, runner = _executor(team)
    status, call = runner.post(f"/executors/{executor_id}/claim")
    assert status == 200 and call["task"] == "a" and call["tool"] == "test.remote" and call["args"] == {"id": "a"}
    assert call["run"] == run_id and call["attempt"] == 1
    task.refresh_from_db()
    assert task.status == "dispatched" and task.claim.startswith(f"executor:{executor_id}:") and task.heartbeat_at is not None
    assert runner.post(f"/executors/{executor_id}/claim")[0] == 204
    status, beat = runner.post(f"/executors/{executor_id}/calls/{call['call']}/heartbeat")
    assert status == 200 and beat == {"held": True, "cancel": False}
    status, body = runner.post(f"/executors/{executor_id}/calls/{call['call']}/result", {"ok": True, "value": {"done": 1}})
    assert status == 200 and body == {"accepted": True}
    task.refresh_from_db()
    assert task.status == "completed" and task.result["value"] == {"done": 1} and task.claim is None
    assert Run.objects.get(pk=run_id).status == "completed"
    # A second report of the same call changes nothing.
    status, body = runner.post(f"/executors/{executor_id}/calls/{call['call']}/result", {"ok": True, "value": 2})
    assert status == 409 and body["error"]["key"] == "lease_lost"


def test_it_fails_a_call_the_executor_reports_failed(team: Team) -> None:
    run_id = _run(team, [_remote("a")])
    executor_id, runner = _executor(team)
    call = runner.post(f"/executors/{executor_id}/claim")[1]
    status, _ = runner.post(f"/executors/{executor_id}/calls/{call['call']}/result", {"ok": False, "error": "disk full"})
    assert status == 200
    task = _task(run_id, "a")
    assert (task.status, task.error_key, task.error_detail) == ("failed", "tool_failed", "disk full")


def test_it_refuses_results_it_cannot_store_and_bad_bodies(team: Team) -> None:
    run_id = _run(team, [_remote("a")])
    executor_id, runner = _executor(team)
    call = runner.post(f"/executors/{executor_id}/claim")[1]
    status, body = runner.post(f"/executors/{executor_id}/calls/{call['call']}/result", {"value": 1})
    assert status == 400
    assert _task(run_id, "a").status == "dispatched"
    status, body = runner.post(f"/executors/{executor_id}/calls/{call['call']}/result", {"ok": True, "value": "nul\u0000byte"})
    assert status == 400 and body["error"]["key"]
    assert _task(run_id, "a").status == "dispatched"


@pytest.mark.parametrize("role", ["reader", "viewer", "outsider"])
def test_it_needs_operator_standing_to_register(team: Team, role: str) -> None:
    status, body = _register(team, role=role)
    assert status == 403 and body["error"]["key"] == "forbidden"
    assert not Executor.objects.filter(owner=team.users[role]).exists()


def test_it_refuses_tools_it_cannot_serve(team: Team) -> None:
    assert _register(team, ["no.such_tool"])[1]["error"]["key"] == "unknown_tool"
    assert _register(team, ["test.echo"])[1]["error"]["key"] == "not_a_runner_tool"
    assert _register(team, [])[0] == 400


def test_it_keeps_executors_to_their_own_token_and_id(team: Team) -> None:
    first_id, first = _executor(team)
    second_id, _ = _executor(team)
    assert first.post(f"/executors/{second_id}/claim")[0] == 403
    assert Api("not-a-token").post(f"/executors/{first_id}/claim")[0] == 401
    # A person's token is not an executor's.
    assert team.api().post(f"/executors/{first_id}/claim")[0] == 401


def test_it_serves_only_the_owners_workspaces(team: Team) -> None:
    other = make_workspace()
    stranger = make_member(workspace=other, role="operator")
    outside = Api(make_token(user=stranger))
    status, body = outside.post("/executors", {"tools": ["test.remote"]})
    assert status == 201
    _run(team, [_remote("a")])
    assert Api(body["token"]).post(f"/executors/{body['id']}/claim")[0] == 204
    # Scoped to a workspace: only that workspace's calls.
    status, scoped = _register(team, workspace=team.slug)
    assert status == 201 and scoped["workspace"] == team.slug
    assert Api(scoped["token"]).post(f"/executors/{scoped['id']}/claim")[0] == 200


@pytest.mark.spec("S10")
def test_it_turns_an_expired_non_replayable_lease_uncertain(team: Team) -> None:
    run_id = _run(
        team,
        [_remote("a"), {"key": "b", "kind": "tool", "tool": "test.echo", "args": {"value": 1}, "after": ["a"]}],
        deliverable="b",
    )
    executor_id, runner = _executor(team)
    call = runner.post(f"/executors/{executor_id}/claim")[1]
    assert sweep_expired_leases() == 0
    Task.objects.filter(pk=int(call["call"])).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    assert sweep_expired_leases() == 1
    task = _task(run_id, "a")
    assert (task.status, task.error_key, task.claim) == ("uncertain", "tool_uncertain", None)
    run = Run.objects.get(pk=run_id)
    assert run.status == "needs_attention" and run.attention["blocked_task_keys"] == ["a"]
    # The late result finds the lease gone; nothing re-runs the call blind.
    assert runner.post(f"/executors/{executor_id}/calls/{call['call']}/result", {"ok": True, "value": 1})[0] == 409
    assert runner.post(f"/executors/{executor_id}/claim")[0] == 204


@pytest.mark.spec("S10")
def test_it_advertises_an_expired_replayable_call_again(team: Team) -> None:
    run_id = _run(team, [_remote("a", replayable=True)])
    executor_id, runner = _executor(team)
    first = runner.post(f"/executors/{executor_id}/claim")[1]
    Task.objects.filter(pk=int(first["call"])).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    assert sweep_expired_leases() == 1
    task = _task(run_id, "a")
    assert (task.status, task.claim) == ("dispatched", None)
    status, second = runner.post(f"/executors/{executor_id}/claim")
    assert status == 200 and second["attempt"] == 2
    assert runner.post(f"/executors/{executor_id}/calls/{first['call']}/heartbeat")[0] == 200  # same call id, the new lease
    assert runner.post(f"/executors/{executor_id}/calls/{second['call']}/result", {"ok": True, "value": "again"})[0] == 200
    assert Run.objects.get(pk=run_id).status == "completed"


@pytest.mark.spec("S8", "S22")
def test_it_fails_unclaimed_calls_of_a_revoked_executor(team: Team) -> None:
    executor_id, runner = _executor(team)
    run_id = _run(team, [_remote("a"), _remote("b")])
    held = runner.post(f"/executors/{executor_id}/claim")[1]
    status, body = team.api().call("DELETE", f"/executors/{executor_id}")
    assert status == 200 and body["revoked"] is True and body["failed_calls"] == 1
    unclaimed = _task(run_id, "b" if held["task"] == "a" else "a")
    assert (unclaimed.status, unclaimed.error_key) == ("failed", "executor_revoked")
    # The call it held lost its lease: non-replayable, so uncertain.
    claimed = _task(run_id, held["task"])
    assert (claimed.status, claimed.error_key) == ("uncertain", "tool_uncertain")
    assert runner.post(f"/executors/{executor_id}/claim")[0] == 401
    status, body = team.api().call("DELETE", f"/executors/{executor_id}")
    assert status == 409 and body["error"]["key"] == "executor_revoked"


def test_it_keeps_unclaimed_calls_another_executor_serves(team: Team) -> None:
    first_id, _ = _executor(team)
    second_id, second = _executor(team)
    run_id = _run(team, [_remote("a")])
    status, body = team.api().call("DELETE", f"/executors/{first_id}")
    assert status == 200 and body["failed_calls"] == 0
    assert _task(run_id, "a").status == "dispatched"
    assert second.post(f"/executors/{second_id}/claim")[0] == 200


def test_it_fails_a_call_addressed_to_a_revoked_executor(team: Team) -> None:
    first_id, _ = _executor(team)
    _executor(team)
    run_id = _run(team, [_remote("a", executor=first_id)])
    status, body = team.api().call("DELETE", f"/executors/{first_id}")
    assert status == 200 and body["failed_calls"] == 1
    assert _task(run_id, "a").error_key == "executor_revoked"


def test_it_lets_only_the_owner_revoke(team: Team) -> None:
    executor_id, _ = _executor(team)
    other = Team()
    assert other.api().call("DELETE", f"/executors/{executor_id}")[0] == 404
    assert team.api().call("DELETE", "/executors/not-a-uuid")[0] == 404
    assert not Executor.objects.get(pk=executor_id).revoked


def test_it_tells_the_executor_when_a_cancel_reaches_its_call(team: Team) -> None:
    run_id = _run(team, [_remote("a")])
    executor_id, runner = _executor(team)
    call = runner.post(f"/executors/{executor_id}/claim")[1]
    assert team.api().post(f"/runs/{run_id}/cancel", {"reason": "stop"})[0] == 200
    assert Run.objects.get(pk=run_id).status == "canceling"
    status, body = runner.post(f"/executors/{executor_id}/calls/{call['call']}/heartbeat")
    assert status == 200 and body == {"held": True, "cancel": True}
    status, body = runner.post(f"/executors/{executor_id}/calls/{call['call']}/result", {"ok": False, "stopped": True})
    assert status == 200
    task = _task(run_id, "a")
    assert (task.status, task.error_key) == ("canceled", "run_canceled")
    assert Run.objects.get(pk=run_id).status == "canceled"


def test_it_cancels_a_stopped_call_whose_executor_never_reports(team: Team) -> None:
    run_id = _run(team, [_remote("a")])
    executor_id, runner = _executor(team)
    call = runner.post(f"/executors/{executor_id}/claim")[1]
    team.api().post(f"/runs/{run_id}/cancel", {"reason": "stop"})
    Task.objects.filter(pk=int(call["call"])).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    assert sweep_expired_leases() == 1
    assert _task(run_id, "a").status == "canceled"
    assert Run.objects.get(pk=run_id).status == "canceled"
