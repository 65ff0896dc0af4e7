"""The OpenAI Agents SDK harness (F7), offline on the SDK's ScriptedModel: the agent runs in the
harness's bridge process (the SDK's `agents` and oz0's Django app cannot share an interpreter);
oz.fail is its tool `oz__fail`, and its calls, cancel and failures go through the kernel."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from runs import kernel
from runs.kernel import call_digest
from runs.models import Run, Task
from tests.conftest import ROOT, Team, wait_for
from tests.harness.conftest import RECORDS, harness_manifest, start_run
from tests.runs.driver import drive

# Starting the bridge imports the SDK (seconds on a busy machine).
SLOW = 90


def _manifest(name: str, attribute: str, **kwargs: Any) -> str:
    return harness_manifest(name, {"openai_agents": f"oz0_test_sdk_agents:{attribute}"}, **kwargs)


def _settled(run: Run) -> Run:
    run.refresh_from_db()
    return run


@pytest.mark.spec("F7", "F6", "F10", "F11", "F18")
def test_oz_fail_is_a_tool_that_ends_the_job_with_a_declared_kind(harness_team: Team) -> None:
    run, thread = start_run(harness_team, _manifest("oa-declared", "declared"), {"issue": 9})
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
    status, card = harness_team.api("viewer").get(f"/insights/agents/oa-declared?workspace={harness_team.slug}")
    assert status == 200 and card["failed"] == 1 and [k["kind"] for k in card["by_kind"]] == ["not_found"], card
    _, document = harness_team.api("viewer").get(f"/runs/{run.pk}")
    assert document["failure"]["kind"] == "not_found" and document["failure"]["message"] is None
    assert "tracker" not in str(document)


@pytest.mark.spec("F7", "F6")
def test_an_undeclared_kind_ends_the_job_undeclared_and_2001_characters_are_refused(harness_team: Team) -> None:
    undeclared, first = start_run(harness_team, _manifest("oa-undeclared", "undeclared"))
    too_long, second = start_run(harness_team, _manifest("oa-long", "too_long"))
    first.join(SLOW)
    second.join(SLOW)
    undeclared = _settled(undeclared)
    assert undeclared.status == "canceled" and undeclared.failure["kind"] == "undeclared"
    assert undeclared.failure["declared"] is False
    round_task = Task.objects.get(run=too_long, key="r1")
    assert round_task.error_key == "round_expansion_refused" and "2001 characters" in round_task.error_detail
    assert (_settled(too_long).failure or {}).get("kind") != "not_found"


@pytest.mark.spec("F7", "S5", "S14")
def test_a_tool_call_under_ask_waits_in_the_inbox_and_its_approval_reaches_the_agent(harness_team: Team) -> None:
    run, thread = start_run(harness_team, _manifest("oa-approve", "echo", tools=["test.echo"], approval="ask"))
    wait_for(lambda: Task.objects.filter(run=run, key="r1.1", status="needs_approval").exists(), timeout=SLOW, message="r1.1")
    _, inbox = harness_team.api("operator").get(f"/inbox?workspace={harness_team.slug}")
    assert [(i["kind"], i["task"], i["tool"]) for i in inbox["items"]] == [("approval", "r1.1", "test.echo")]
    kernel.approve(run_id=run.pk, key="r1.1", user=harness_team.users["operator"])
    drive(run)
    thread.join(SLOW)
    run = _settled(run)
    assert run.status == "completed" and json.loads(run.output) == {"said": "hello"}
    assert Task.objects.get(run=run, key="r1").result["usage"] == {"input_tokens": 30, "output_tokens": 7, "calls": 2}


@pytest.mark.spec("F7", "S5", "S6", "F14")
def test_a_denial_reaches_the_agent_in_the_approvers_words(harness_team: Team) -> None:
    run, thread = start_run(harness_team, _manifest("oa-deny", "echo", tools=["test.echo"], approval="ask"))
    wait_for(lambda: Task.objects.filter(run=run, key="r1.1", status="needs_approval").exists(), timeout=SLOW, message="r1.1")
    operator = harness_team.users["operator"]
    kernel.deny(run_id=run.pk, key="r1.1", user=operator, reason="not on a Friday")
    thread.join(SLOW)
    run = _settled(run)
    failure = json.loads(run.output)
    assert run.status == "completed" and failure["kind"] == "denied" and failure["message"] == "not on a Friday"
    assert failure["words_of"] == f"the approver {operator.username}"


@pytest.mark.spec("F7", "S29")
def test_a_cancel_reaches_the_streamed_run_within_two_seconds(harness_team: Team) -> None:
    record = RECORDS / "sdk-slow.json"
    record.unlink(missing_ok=True)
    run, thread = start_run(harness_team, _manifest("oa-cancel", "slow"))
    wait_for(lambda: record.exists(), timeout=SLOW, message="the model call")
    asked = time.time()
    kernel.cancel_run(run_id=run.pk, user=harness_team.users["operator"], reason="stop")
    canceled = wait_for(lambda: json.loads(record.read_text()).get("canceled"), timeout=10, message="the SDK's cancel")
    assert canceled - asked < 2.0
    thread.join(SLOW)
    run = _settled(run)
    round_task = Task.objects.get(run=run, key="r1")
    assert round_task.error_key == "run_canceled" and run.status == "canceled"
    record.unlink(missing_ok=True)


@pytest.mark.spec("F7", "F9", "S22")
def test_a_crashing_model_fails_typed(harness_team: Team) -> None:
    crashed, first = start_run(harness_team, _manifest("oa-broken", "broken"))
    first.join(SLOW)
    round_task = Task.objects.get(run=crashed, key="r1")
    assert round_task.error_key == "harness_crashed" and round_task.claim is None
    assert "the model exploded" in round_task.result["stderr"]
    _, document = harness_team.api("viewer").get(f"/runs/{crashed.pk}")
    assert document["tasks"][0]["failure"]["kind"] == "error" and "exploded" not in str(document)


def _approval_run(team: Team, name: str) -> tuple[Run, Any, Task]:
    run, thread = start_run(team, _manifest(name, "approves", approval="ask"))
    call = wait_for(
        lambda: Task.objects.filter(run=run, key="r1.1", status="needs_approval").first(), timeout=SLOW, message="r1.1"
    )
    return run, thread, call


@pytest.mark.spec("F7", "S5", "S14")
def test_a_tool_that_needs_approval_waits_in_the_inbox_bound_to_its_digest_and_runs_once_approved(harness_team: Team) -> None:
    run, thread, call = _approval_run(harness_team, "oa-native-approve")
    args = {"branch": "release-1.2"}
    assert call.spec == {"tool": "delete_branch", "args": args, "native": True}
    _, inbox = harness_team.api("operator").get(f"/inbox?workspace={harness_team.slug}")
    [item] = [i for i in inbox["items"] if i["run"] == str(run.pk)]
    assert (item["tool"], item["args"], item["digest"]) == ("delete_branch", args, call_digest("delete_branch", args))
    status, _ = harness_team.api("operator").post(f"/runs/{run.pk}/tasks/r1.1/approve", {"digest": item["digest"]})
    assert status == 200
    thread.join(SLOW)
    run = _settled(run)
    assert run.status == "completed" and run.output == "deleted release-1.2", Task.objects.get(run=run, key="r1").result
    round_task = Task.objects.get(run=run, key="r1")
    assert "delete_branch ran for release-1.2" in round_task.result["stderr"]
    assert round_task.result["usage"]["calls"] == 2


@pytest.mark.spec("F7", "S5", "S6", "F14")
def test_a_rejected_tool_hands_the_model_the_approvers_words_and_never_runs(harness_team: Team) -> None:
    run, thread, _ = _approval_run(harness_team, "oa-native-deny")
    operator = harness_team.users["operator"]
    kernel.deny(run_id=run.pk, key="r1.1", user=operator, reason="not on a Friday")
    thread.join(SLOW)
    run = _settled(run)
    assert run.status == "completed" and run.output is not None
    denial = json.loads(run.output)
    assert denial["kind"] == "denied" and denial["message"] == "not on a Friday"
    assert denial["words_of"] == f"the approver {operator.username}"
    assert "delete_branch ran" not in Task.objects.get(run=run, key="r1").result.get("stderr", "")


@pytest.mark.spec("F7", "F6")
def test_the_example_openai_agents_sdk_agent_runs_offline(harness_team: Team) -> None:
    manifest = (ROOT / "oz0agents" / "examples" / "openai-triage.yaml").read_text()
    run, thread = start_run(harness_team, manifest, {"issue": 7})
    failed, other = start_run(harness_team, manifest, {"issue": 404})
    wait_for(lambda: Task.objects.filter(run=run, key="r1.1", ready=True).exists(), timeout=SLOW, message="clock")
    drive(run)
    thread.join(SLOW)
    other.join(SLOW)
    assert _settled(run).status == "completed" and run.output == "triaged; the clock answered"
    failed = _settled(failed)
    assert failed.status == "canceled" and failed.failure["kind"] == "not_found" and failed.failure["declared"] is True
