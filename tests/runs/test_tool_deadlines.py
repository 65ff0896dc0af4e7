"""Every tool call ends: a deadline from its claim (tool_timeout), and a runner call nobody serves
fails tool_not_served after OZ0_UNSERVED_SECONDS, each under the task's own on_failure."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from runs import failures, kernel
from runs.kernel import InvalidRequest, sweep_clocks, sweep_unserved_calls
from runs.models import Executor, Run, TraceEvent
from tests.conftest import Api, Team
from tests.factories import make_member, make_token, make_workspace
from tests.runs.driver import drive, task


def create(team: Team, tasks: list[dict[str, Any]], deliverable: str, **body: Any) -> Run:
    run, _ = kernel.create_run(
        workspace=team.workspace, user=team.users["operator"], body={"tasks": tasks, "deliverable": deliverable, **body}
    )
    return run


def sleeper(key: str = "s", seconds: float = 3600, **extra: Any) -> dict[str, Any]:
    return {"key": key, "kind": "tool", "tool": "test.sleep", "args": {"seconds": seconds}, **extra}


def remote(key: str = "a", **extra: Any) -> dict[str, Any]:
    return {"key": key, "kind": "tool", "tool": "test.remote", "args": {"id": key}, **extra}


@pytest.mark.spec("S22")
def test_it_times_out_a_hung_kernel_tool_and_tells_its_holder_to_stop(team: Team) -> None:
    run = create(team, [sleeper(timeout_s=5, on_failure="halt")], "s")
    s = task(run, "s")
    claimed = kernel.claim_task(None, s.pk, "worker-a")
    assert claimed is not None
    s.refresh_from_db()
    assert s.deadline_at is not None and 4 <= (s.deadline_at - s.started_at).total_seconds() <= 6
    # The holder heartbeats forever; the deadline ends the call all the same.
    assert kernel.heartbeat("worker-a") is False
    assert sweep_clocks(timezone.now() + timedelta(seconds=6)) == 1
    s.refresh_from_db()
    assert (s.status, s.error_key, s.claim, s.cancel_requested) == ("timed_out", "tool_timeout", None, True)
    assert failures.kind_for_error_key(s.error_key) == "timeout"
    # Its holder learns it must stop; its late report changes nothing.
    assert kernel.heartbeat("worker-a") is True
    assert kernel.task_complete(claimed, 1) is False
    run.refresh_from_db()
    assert run.status == "needs_attention" and run.attention["blocked_task_keys"] == ["s"]


def test_it_gives_every_tool_call_the_default_deadline(team: Team, settings: Any) -> None:
    settings.OZ0_TOOL_TIMEOUT_SECONDS = 900
    run = create(team, [sleeper()], "s")
    s = task(run, "s")
    kernel.claim_task(None, s.pk, "worker-a")
    s.refresh_from_db()
    assert round((s.deadline_at - s.started_at).total_seconds()) == 900
    assert sweep_clocks(timezone.now() + timedelta(seconds=899)) == 0
    assert sweep_clocks(timezone.now() + timedelta(seconds=901)) == 1
    assert task(run, "s").status == "timed_out"


def test_it_stops_a_cooperative_tool_at_its_deadline(team: Team) -> None:
    from runs.worker.execution import run_tool

    run = create(team, [sleeper(timeout_s=1, on_failure="absorb"), {**sleeper("next", 0), "after": ["s"]}], "next")
    claimed = kernel.claim_task(None, task(run, "s").pk, "worker-a")
    assert claimed is not None
    cancel = threading.Event()
    sweep_clocks(timezone.now() + timedelta(seconds=2))
    # What the worker's heartbeat does when the kernel answers "stop".
    cancel.set()
    run_tool(claimed, cancel)
    assert task(run, "s").status == "timed_out"
    run = drive(run)
    assert run.status == "completed"


def test_it_takes_a_model_composed_calls_deadline_from_the_manifest(team: Team) -> None:
    from oz0agents.registry import register
    from runs.worker.execution import execute_claimed

    name = f"waiter-{uuid.uuid4().hex[:8]}"
    register(
        f"name: {name}\nmodel: script\ninstructions: Sleep, then echo.\ntools:\n  - name: test.sleep\n    timeout_s: 7\n  - test.echo\n"
        "script:\n  - tool_calls:\n      - tool: test.sleep\n        args: {seconds: 60}\n      - tool: test.echo\n"
        "  - text: done\n",
        workspace=team.workspace,
    )
    run, _ = kernel.create_run(
        workspace=team.workspace, user=team.users["operator"], body={"agent": name, "approval": {"mode": "bypass"}}
    )
    claimed = kernel.claim_task(None, task(run, "r1").pk, "worker-r")
    assert claimed is not None
    execute_claimed(claimed, threading.Event())
    assert task(run, "r1.1").spec["timeout_s"] == 7.0
    assert "timeout_s" not in task(run, "r1.2").spec
    sleeping = kernel.claim_task(None, task(run, "r1.1").pk, "worker-s")
    assert sleeping is not None
    assert sweep_clocks(timezone.now() + timedelta(seconds=8)) == 1
    assert task(run, "r1.1").error_key == "tool_timeout"


@pytest.mark.parametrize("timeout", [0, -1, "5", True, 10**9])
def test_it_refuses_a_timeout_that_is_no_deadline(team: Team, timeout: Any) -> None:
    with pytest.raises(InvalidRequest) as refused:
        create(team, [sleeper(timeout_s=timeout)], "s")
    assert refused.value.key == "invalid_field"
    assert not Run.objects.filter(workspace=team.workspace).exists()


def test_it_times_out_a_claimed_runner_call(team: Team) -> None:
    status, body = team.api().post("/executors", {"tools": ["test.remote"]})
    assert status == 201
    runner = Api(body["token"])
    run = create(team, [remote(timeout_s=30, on_failure="halt")], "a")
    status, call = runner.post(f"/executors/{body['id']}/claim")
    assert status == 200
    assert sweep_clocks(timezone.now() + timedelta(seconds=31)) == 1
    a = task(run, "a")
    assert (a.status, a.error_key, a.claim) == ("timed_out", "tool_timeout", None)
    status, beat = runner.post(f"/executors/{body['id']}/calls/{call['call']}/heartbeat")
    assert status == 409 and beat["error"]["key"] == "lease_lost"


def test_it_fails_a_runner_call_no_live_executor_serves(team: Team, settings: Any) -> None:
    settings.OZ0_UNSERVED_SECONDS = 60
    run = create(team, [remote(on_failure="halt"), remote("b", on_failure="propagate"), {**sleeper("c", 0), "after": ["b"]}], "c")
    assert sweep_unserved_calls(timezone.now() + timedelta(seconds=59)) == 0
    assert task(run, "a").status == "dispatched"
    assert sweep_unserved_calls(timezone.now() + timedelta(seconds=61)) == 2
    a, b, c = task(run, "a"), task(run, "b"), task(run, "c")
    assert (a.status, a.error_key, b.status, b.error_key) == ("failed", "tool_not_served", "failed", "tool_not_served")
    assert failures.kind_for_error_key("tool_not_served") == "unavailable"
    # Each under its own on_failure: b propagated to c, a holds the run.
    assert c.status == "skipped"
    run.refresh_from_db()
    assert run.status == "needs_attention" and run.attention["blocked_task_keys"] == ["a"]


def test_it_lets_a_served_call_wait_and_fails_it_once_its_executor_is_gone(team: Team, settings: Any) -> None:
    settings.OZ0_UNSERVED_SECONDS = 60
    status, body = team.api().post("/executors", {"tools": ["test.remote"]})
    assert status == 201
    run = create(team, [remote()], "a")
    later = timezone.now() + timedelta(seconds=120)
    Executor.objects.filter(pk=body["id"]).update(last_heartbeat_at=later - timedelta(seconds=5))
    assert sweep_unserved_calls(later) == 0
    assert task(run, "a").status == "dispatched"
    # The executor was last seen longer ago than the call may wait: nobody live serves it.
    Executor.objects.filter(pk=body["id"]).update(last_heartbeat_at=later - timedelta(seconds=61))
    assert sweep_unserved_calls(later) == 1
    assert task(run, "a").error_key == "tool_not_served"


def test_it_counts_only_executors_that_may_claim_the_call(team: Team, settings: Any) -> None:
    settings.OZ0_UNSERVED_SECONDS = 60
    # An executor of another workspace's operator serves the tool, but not this workspace.
    stranger = make_member(workspace=make_workspace(), role="operator")
    assert Api(make_token(user=stranger)).post("/executors", {"tools": ["test.remote"]})[0] == 201
    # An executor of this workspace serves it, but the call is addressed to another one.
    status, mine = team.api().post("/executors", {"tools": ["test.remote"]})
    assert status == 201
    run = create(team, [{**remote(), "args": {"id": "a", "executor": "00000000-0000-0000-0000-000000000000"}}], "a")
    Executor.objects.update(last_heartbeat_at=timezone.now() + timedelta(seconds=100))
    assert sweep_unserved_calls(timezone.now() + timedelta(seconds=120)) == 1
    assert task(run, "a").error_key == "tool_not_served"
    assert TraceEvent.objects.filter(run=run, task_key="a", to_status="failed", actor="sweep").exists()
