"""A cancel while a harness waits on a call (issue 25, item 3): the cancel settles the waiting call at
once, before the heartbeat reaches the worker; the harness must be told `cancel`, never handed the
stopped call's failure to answer around, and a canceling run's round is never `completed`.

The heartbeat is slowed to 30 s here, so only the database can tell the waiting session of the
cancel: what these tests prove does not rest on a race with the heartbeat."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from oz0agents.registry import register
from runs import kernel
from runs.models import Run, Task, TraceEvent
from tests.conftest import Team, wait_for
from tests.harness.conftest import harness_manifest, jsonl_manifest, record_path, records, start_run

SLOW = 90


@pytest.fixture
def slow_heartbeat(harness_team: Team, settings: Any) -> Team:
    settings.OZ0_HEARTBEAT_SECONDS = 30
    return harness_team


def _cancel_while_r1_1_waits(team: Team, run: Run) -> None:
    wait_for(lambda: Task.objects.filter(run=run, key="r1.1", status="needs_approval").exists(), timeout=SLOW, message="r1.1")
    kernel.cancel_run(run_id=run.pk, user=team.users["operator"], reason="stop")


def _ended_canceled(run: Run) -> Task:
    run.refresh_from_db()
    round_task = Task.objects.get(run=run, key="r1")
    assert round_task.status == "canceled" and round_task.error_key == "run_canceled", (round_task.status, run.output)
    assert run.status == "canceled" and run.failure["kind"] == "cancelled" and run.output is None
    assert Task.objects.get(run=run, key="r1.1").status == "canceled"
    return round_task


@pytest.mark.spec("F7", "S29", "F1")
def test_a_jsonl_harness_waiting_on_a_call_gets_cancel_and_its_round_is_never_completed(slow_heartbeat: Team) -> None:
    record = record_path()
    script = [{"call": "test.echo", "args": {"value": 1}}, {"done": "$last"}]
    run, thread = start_run(slow_heartbeat, jsonl_manifest("jl-cw", script, record=record, tools=["test.echo"], approval="ask"))
    _cancel_while_r1_1_waits(slow_heartbeat, run)
    thread.join(SLOW)
    _ended_canceled(run)
    received = [m["type"] for m in records(record)]
    assert received == ["start", "cancel"], received  # never the stopped call's result


@pytest.mark.spec("F7", "S29", "F1")
def test_a_pydantic_ai_agent_waiting_on_a_call_is_canceled_not_completed(slow_heartbeat: Team) -> None:
    manifest = harness_manifest("pa-cw", {"pydantic_ai": "oz0_test_pydantic_agents:echo"}, tools=["test.echo"], approval="ask")
    run, thread = start_run(slow_heartbeat, manifest)
    _cancel_while_r1_1_waits(slow_heartbeat, run)
    thread.join(SLOW)
    round_task = _ended_canceled(run)
    assert "oz0 canceled the run" in round_task.result["stderr"]  # the bridge read the cancel line (item 8: stderr kept)


@pytest.mark.spec("F7", "S29", "F1")
def test_an_agents_sdk_agent_waiting_on_a_call_is_canceled_not_completed(slow_heartbeat: Team) -> None:
    manifest = harness_manifest("oa-cw", {"openai_agents": "oz0_test_sdk_agents:echo"}, tools=["test.echo"], approval="ask")
    run, thread = start_run(slow_heartbeat, manifest)
    _cancel_while_r1_1_waits(slow_heartbeat, run)
    thread.join(SLOW)
    round_task = _ended_canceled(run)
    assert "oz0 canceled the run" in round_task.result["stderr"]


def _acp(name: str, script: list[dict[str, Any]], record: Path) -> str:
    env = {"OZ0_TEST_SCRIPT": json.dumps(script), "OZ0_TEST_RECORD": str(record)}
    return harness_manifest(name, {"acp": {"program": "acp-scripted", "env": env}}, tools=["test.echo"], approval="ask")


@pytest.mark.spec("F7", "S29", "F1")
def test_an_acp_agent_waiting_on_a_tool_gets_session_cancel_and_is_not_completed(slow_heartbeat: Team) -> None:
    record = record_path()
    script = [{"tool": "test__echo", "args": {"value": 1}}, {"say": "$last"}]
    run, thread = start_run(slow_heartbeat, _acp("acp-cw", script, record))
    _cancel_while_r1_1_waits(slow_heartbeat, run)
    thread.join(SLOW)
    _ended_canceled(run)
    assert [n for n in records(record) if n["event"] == "cancel"], records(record)


@pytest.mark.spec("F7", "S29", "F1")
def test_an_acp_permission_waiting_when_the_run_is_canceled_is_answered_cancelled(slow_heartbeat: Team) -> None:
    record = record_path()
    script = [{"permission": {"title": "rm -rf build", "kind": "execute"}}, {"say": "$last"}]
    run, thread = start_run(slow_heartbeat, _acp("acp-cw-perm", script, record))
    _cancel_while_r1_1_waits(slow_heartbeat, run)
    thread.join(SLOW)
    _ended_canceled(run)


@pytest.mark.spec("F7", "F1")
def test_the_kernel_refuses_to_complete_a_round_of_a_canceling_run_typed_in_the_trace(harness_team: Team) -> None:
    registered = register(jsonl_manifest("jl-refused", []), workspace=harness_team.workspace)
    run, _ = kernel.create_run(
        workspace=harness_team.workspace, user=harness_team.users["operator"], body={"agent": registered.version.agent.name}
    )
    round_task = Task.objects.get(run=run, key="r1")
    claimed = kernel.claim_task(run.pk, round_task.pk, "host:1:refused")
    assert claimed is not None
    kernel.cancel_run(run_id=run.pk, user=harness_team.users["operator"], reason="stop")
    assert (
        kernel.task_complete(claimed, "an answer", extra={"usage": {"input_tokens": 5, "output_tokens": 1, "calls": 1}}) is False
    )
    round_task.refresh_from_db()
    run.refresh_from_db()
    assert round_task.status == "canceled" and round_task.error_key == "run_canceled" and round_task.claim is None
    assert round_task.result.get("value") is None and round_task.result["usage"]["input_tokens"] == 5  # billed all the same
    refused = TraceEvent.objects.get(run=run, task_key="r1", event="report_refused")
    assert refused.data["report"] == "completed" and refused.data["key"] == "run_canceling"
    assert run.status == "canceled" and run.output is None
