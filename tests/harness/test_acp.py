"""The ACP harness (F7), offline: oz0 is the ACP client of a scripted agent process, which finds
oz.fail as the tool `fail` on its MCP server `oz0`; calls, cancel and failures go through the kernel."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from runs import kernel
from runs.kernel import call_digest
from runs.models import Run, Task, TraceEvent
from tests.conftest import Team, wait_for
from tests.harness.conftest import RoundThread, harness_manifest, record_path, records, start_run
from tests.runs.driver import drive

SLOW = 60


def _manifest(name: str, script: list[dict[str, Any]], *, record: Path | None = None, **kwargs: Any) -> str:
    env = {"OZ0_TEST_SCRIPT": json.dumps(script)}
    if record is not None:
        env["OZ0_TEST_RECORD"] = str(record)
    return harness_manifest(name, {"acp": {"program": "acp-scripted", "env": env}}, **kwargs)


def _settled(run: Run) -> Run:
    run.refresh_from_db()
    return run


@pytest.mark.spec("F7", "F6", "F10", "F11", "F18")
def test_fail_on_the_oz0_mcp_server_ends_the_job_with_a_declared_kind(harness_team: Team) -> None:
    record = record_path()
    script = [{"tool": "fail", "args": {"kind": "not_found", "message": "issue 9 is not in the tracker"}}]
    run, thread = start_run(harness_team, _manifest("acp-declared", script, record=record, tools=["test.echo"]), {"issue": 9})
    thread.join(SLOW)
    run = _settled(run)
    assert run.status == "canceled", Task.objects.get(run=run, key="r1").error_detail
    assert run.failure == {
        "kind": "not_found",
        "retryable": False,
        "partial": False,
        "person": True,
        "message": "issue 9 is not in the tracker",
        "declared": True,
    }
    noted = records(record)
    assert noted[0]["servers"] == ["oz0"] and noted[1]["names"] == ["ask", "fail", "test__echo"]
    status, card = harness_team.api("viewer").get(f"/insights/agents/acp-declared?workspace={harness_team.slug}")
    assert status == 200 and card["failed"] == 1 and [k["kind"] for k in card["by_kind"]] == ["not_found"], card
    _, document = harness_team.api("viewer").get(f"/runs/{run.pk}")
    assert document["failure"]["kind"] == "not_found" and document["failure"]["message"] is None
    assert "tracker" not in str(document)


@pytest.mark.spec("F7", "F6")
def test_an_undeclared_kind_ends_the_job_undeclared_and_2001_characters_are_refused(harness_team: Team) -> None:
    undeclared, first = start_run(
        harness_team, _manifest("acp-undeclared", [{"tool": "fail", "args": {"kind": "nope", "message": "m"}}])
    )
    too_long, second = start_run(
        harness_team, _manifest("acp-long", [{"tool": "fail", "args": {"kind": "not_found", "message": "x" * 2001}}])
    )
    first.join(SLOW)
    second.join(SLOW)
    undeclared = _settled(undeclared)
    assert undeclared.status == "canceled" and undeclared.failure["kind"] == "undeclared"
    round_task = Task.objects.get(run=too_long, key="r1")
    assert round_task.error_key == "round_expansion_refused" and "2001 characters" in round_task.error_detail


@pytest.mark.spec("F7", "S5", "S6", "S14", "F14")
def test_a_tool_call_under_ask_waits_in_the_inbox_and_approve_and_deny_reach_the_agent(harness_team: Team) -> None:
    script = [{"tool": "test__echo", "args": {"value": {"said": "hello"}}}, {"say": "$last"}]
    approved, first = start_run(harness_team, _manifest("acp-approve", script, tools=["test.echo"], approval="ask"))
    denied, second = start_run(harness_team, _manifest("acp-deny", script, tools=["test.echo"], approval="ask"))
    for run in (approved, denied):
        wait_for(
            lambda run=run: Task.objects.filter(run=run, key="r1.1", status="needs_approval").exists(),
            timeout=SLOW,
            message="r1.1",
        )
    _, inbox = harness_team.api("operator").get(f"/inbox?workspace={harness_team.slug}")
    assert sorted((i["kind"], i["task"], i["tool"]) for i in inbox["items"]) == [("approval", "r1.1", "test.echo")] * 2
    operator = harness_team.users["operator"]
    kernel.approve(run_id=approved.pk, key="r1.1", user=operator)
    kernel.deny(run_id=denied.pk, key="r1.1", user=operator, reason="not on a Friday")
    drive(approved)
    first.join(SLOW)
    second.join(SLOW)
    approved, denied = _settled(approved), _settled(denied)
    assert approved.status == "completed" and json.loads(approved.output) == {"said": "hello"}
    failure = json.loads(denied.output)
    assert denied.status == "completed" and failure["kind"] == "denied" and failure["message"] == "not on a Friday"
    assert failure["words_of"] == f"the approver {operator.username}"


@pytest.mark.spec("F7", "S29")
def test_session_cancel_reaches_the_agent_within_two_seconds(harness_team: Team) -> None:
    record = record_path()
    run, thread = start_run(harness_team, _manifest("acp-cancel", [{"wait": True}], record=record))
    wait_for(lambda: [n for n in records(record) if n["event"] == "tools"], timeout=SLOW, message="the agent's turn")
    asked = time.time()
    kernel.cancel_run(run_id=run.pk, user=harness_team.users["operator"], reason="stop")
    cancel = wait_for(lambda: [n for n in records(record) if n["event"] == "cancel"], timeout=10, message="session/cancel")
    assert cancel[0]["at"] - asked < 2.0
    thread.join(SLOW)
    run = _settled(run)
    assert Task.objects.get(run=run, key="r1").error_key == "run_canceled" and run.status == "canceled"


@pytest.mark.spec("F7", "F9", "S22")
def test_a_crashed_agent_and_a_missing_one_fail_typed(harness_team: Team) -> None:
    crashed, first = start_run(harness_team, _manifest("acp-crash", [{"crash": 3}]))
    missing, second = start_run(harness_team, harness_manifest("acp-missing", {"acp": {"program": "not-installed"}}))
    first.join(SLOW)
    second.join(SLOW)
    round_task = Task.objects.get(run=crashed, key="r1")
    assert round_task.error_key in ("harness_crashed", "harness_protocol_error") and round_task.claim is None, (
        round_task.error_detail
    )
    round_task = Task.objects.get(run=missing, key="r1")
    assert round_task.error_key == "harness_unavailable" and round_task.claim is None


@pytest.mark.spec("F7", "F6")
def test_the_example_acp_agent_runs_offline(harness_team: Team) -> None:
    from tests.conftest import ROOT

    manifest = (ROOT / "oz0agents" / "examples" / "acp-triage.yaml").read_text()
    run, thread = start_run(harness_team, manifest, {"issue": 7})
    failed, other = start_run(harness_team, manifest, {"issue": 404})
    wait_for(lambda: Task.objects.filter(run=run, key="r1.1", ready=True).exists(), timeout=SLOW, message="clock")
    drive(run)
    thread.join(SLOW)
    other.join(SLOW)
    assert _settled(run).status == "completed" and run.output.startswith('issue 7 triaged; the clock said {"unix"')
    failed = _settled(failed)
    assert failed.status == "canceled" and failed.failure["kind"] == "not_found" and failed.failure["declared"] is True


@pytest.mark.spec("F7", "F14")
def test_each_tool_has_its_own_schema_and_an_acp_agent_delegates_with_plain_arguments(harness_team: Team) -> None:
    from oz0agents.registry import register
    from tests.harness.conftest import RoundThread, jsonl_manifest

    register(jsonl_manifest("acp-helper", [{"done": {"answer": 42}}]), workspace=harness_team.workspace)
    record = record_path()
    script = [{"tool": "oz__delegate", "args": {"agent": "acp-helper", "input": {"q": 1}}}, {"say": "$last"}]
    run, thread = start_run(harness_team, _manifest("acp-boss", script, record=record, tools=["oz.delegate", "test.echo"]))
    listed = wait_for(lambda: [n for n in records(record) if n["event"] == "tools"], timeout=SLOW, message="the tool list")[0]
    assert listed["names"] == ["ask", "fail", "oz__delegate", "test__echo"]
    assert listed["schemas"]["oz__delegate"]["required"] == ["agent"]
    assert listed["schemas"]["fail"]["required"] == ["kind", "message"]
    child = wait_for(lambda: Run.objects.filter(parent=run).first(), timeout=SLOW, message="the child run")
    assert child.agent_name == "acp-helper" and child.input == {"q": 1}
    RoundThread(child).join(SLOW)
    thread.join(SLOW)
    run = _settled(run)
    assert run.status == "completed" and json.loads(run.output) == {"answer": 42}


PERMISSION = {"kind": "execute", "title": "Run rm -rf build/", "raw_input": {"command": "rm -rf build/"}}
PERMISSION_ARGS = {"kind": "execute", "title": "Run rm -rf build/", "rawInput": {"command": "rm -rf build/"}}


@pytest.mark.spec("F7", "S5", "S14")
def test_a_permission_request_waits_in_the_inbox_bound_to_its_digest_and_approval_selects_allow_once(harness_team: Team) -> None:
    script = [{"permission": PERMISSION}, {"say": "$last"}]
    run, thread = start_run(harness_team, _manifest("acp-permission-yes", script, approval="ask"))
    call = wait_for(
        lambda: Task.objects.filter(run=run, key="r1.1", status="needs_approval").first(), timeout=SLOW, message="r1.1"
    )
    assert call.spec == {"tool": "acp.execute", "args": PERMISSION_ARGS, "native": True}
    _, inbox = harness_team.api("operator").get(f"/inbox?workspace={harness_team.slug}")
    [item] = [i for i in inbox["items"] if i["run"] == str(run.pk)]
    assert item["digest"] == call_digest("acp.execute", PERMISSION_ARGS)
    status, _ = harness_team.api("operator").post(f"/runs/{run.pk}/tasks/r1.1/approve", {"digest": item["digest"]})
    assert status == 200
    thread.join(SLOW)
    run = _settled(run)
    assert run.status == "completed" and json.loads(run.output) == {"outcome": {"outcome": "selected", "optionId": "once"}}


@pytest.mark.spec("F7", "S5", "S6", "F14")
def test_a_denied_permission_selects_reject_with_the_approvers_words(harness_team: Team) -> None:
    script = [{"permission": PERMISSION}, {"say": "$last"}]
    run, thread = start_run(harness_team, _manifest("acp-permission-no", script, approval="ask"))
    wait_for(lambda: Task.objects.filter(run=run, key="r1.1", status="needs_approval").exists(), timeout=SLOW, message="r1.1")
    operator = harness_team.users["operator"]
    kernel.deny(run_id=run.pk, key="r1.1", user=operator, reason="not on a Friday")
    thread.join(SLOW)
    run = _settled(run)
    answer = json.loads(run.output)
    assert answer["outcome"]["outcome"] == "selected" and answer["outcome"]["optionId"] == "no"
    failure = answer["_meta"]["oz0"]["failure"]
    assert failure["kind"] == "denied" and failure["message"] == "not on a Friday"
    assert failure["words_of"] == f"the approver {operator.username}"


@pytest.mark.spec("F7", "S5")
def test_a_permission_the_rules_allow_is_granted_without_a_person(harness_team: Team) -> None:
    from oz0agents.registry import register

    manifest = json.loads(_manifest("acp-permission-rules", [{"permission": PERMISSION}, {"say": "$last"}]))
    manifest["approval"] = {
        "mode": "rules",
        "rules": [{"tool": "acp.execute", "decision": "allow", "when": {"args.rawInput.command": {"prefix": "rm -rf build/"}}}],
    }
    registered = register(json.dumps(manifest), workspace=harness_team.workspace)
    run, _ = kernel.create_run(
        workspace=harness_team.workspace, user=harness_team.users["operator"], body={"agent": registered.version.agent.name}
    )
    RoundThread(run).join(SLOW)
    run = _settled(run)
    assert json.loads(run.output)["outcome"] == {"outcome": "selected", "optionId": "once"}
    assert TraceEvent.objects.filter(run=run, task_key="r1.1", event="approval_granted").exists()
