"""The Pydantic AI harness (F7), offline on FunctionModel: the agent runs in the harness's bridge
process (never the worker's), oz.fail is the tool `oz__fail`, registry tools and oz.ask are tools of
oz0's toolset, and each goes through the kernel like oz0's own loop's."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from oz0agents.registry import register
from runs import kernel
from runs.kernel import call_digest
from runs.models import Run, Task
from tests.conftest import ROOT, Team, wait_for
from tests.harness.conftest import RECORDS, RoundThread, harness_manifest, start_run
from tests.runs.driver import drive

# Starting a bridge imports Pydantic AI (seconds on a busy machine).
SLOW = 60


def _manifest(name: str, attribute: str, **kwargs: object) -> str:
    return harness_manifest(name, {"pydantic_ai": f"oz0_test_pydantic_agents:{attribute}"}, **kwargs)  # type: ignore[arg-type]


def _settled(run: Run) -> Run:
    run.refresh_from_db()
    return run


@pytest.mark.spec("F7", "F6", "F10", "F11", "F18")
def test_oz_fail_is_a_tool_that_ends_the_job_with_a_declared_kind(harness_team: Team) -> None:
    run, thread = start_run(harness_team, _manifest("pa-declared", "declared", tools=["test.echo"]), {"issue": 9})
    thread.join(SLOW)
    run = _settled(run)
    assert run.status == "canceled"
    assert run.failure == {
        "kind": "not_found",
        "retryable": False,
        "partial": False,
        "person": True,
        "message": "issue 9 is not in the tracker",
        "declared": True,
    }
    status, card = harness_team.api("viewer").get(f"/insights/agents/pa-declared?workspace={harness_team.slug}")
    assert status == 200 and card["failed"] == 1 and [k["kind"] for k in card["by_kind"]] == ["not_found"], card
    _, document = harness_team.api("viewer").get(f"/runs/{run.pk}")
    assert document["failure"]["kind"] == "not_found" and document["failure"]["message"] is None
    assert "tracker" not in str(document)


@pytest.mark.spec("F7", "F6")
def test_an_undeclared_kind_ends_the_job_undeclared(harness_team: Team) -> None:
    run, thread = start_run(harness_team, _manifest("pa-undeclared", "undeclared"))
    thread.join(SLOW)
    run = _settled(run)
    assert run.status == "canceled" and run.failure["kind"] == "undeclared" and run.failure["declared"] is False


@pytest.mark.spec("F7", "F6")
def test_a_message_of_2001_characters_is_refused(harness_team: Team) -> None:
    run, thread = start_run(harness_team, _manifest("pa-long", "too_long"))
    thread.join(SLOW)
    run = _settled(run)
    round_task = Task.objects.get(run=run, key="r1")
    assert round_task.error_key == "round_expansion_refused" and "2001 characters" in round_task.error_detail
    assert (run.failure or {}).get("kind") != "not_found"


@pytest.mark.spec("F7", "S5", "S14")
def test_a_tool_call_under_ask_waits_in_the_inbox_and_its_approval_reaches_the_agent(harness_team: Team) -> None:
    run, thread = start_run(harness_team, _manifest("pa-approve", "echo", tools=["test.echo"], approval="ask"))
    wait_for(lambda: Task.objects.filter(run=run, key="r1.1", status="needs_approval").exists(), timeout=SLOW, message="r1.1")
    _, inbox = harness_team.api("operator").get(f"/inbox?workspace={harness_team.slug}")
    assert [(i["kind"], i["task"], i["tool"]) for i in inbox["items"]] == [("approval", "r1.1", "test.echo")]
    kernel.approve(run_id=run.pk, key="r1.1", user=harness_team.users["operator"])
    drive(run)
    thread.join(SLOW)
    run = _settled(run)
    assert run.status == "completed" and json.loads(run.output) == {"said": "hello"}
    # The tokens the FunctionModel reported for its two requests are billed on the round.
    assert Task.objects.get(run=run, key="r1").result["usage"] == {"input_tokens": 30, "output_tokens": 7, "calls": 2}


@pytest.mark.spec("F7", "S5", "S6", "F14")
def test_a_denial_reaches_the_agent_in_the_approvers_words(harness_team: Team) -> None:
    run, thread = start_run(harness_team, _manifest("pa-deny", "echo", tools=["test.echo"], approval="ask"))
    wait_for(lambda: Task.objects.filter(run=run, key="r1.1", status="needs_approval").exists(), timeout=SLOW, message="r1.1")
    operator = harness_team.users["operator"]
    kernel.deny(run_id=run.pk, key="r1.1", user=operator, reason="not on a Friday")
    thread.join(SLOW)
    run = _settled(run)
    failure = json.loads(run.output)
    assert run.status == "completed" and failure["failed"] is True and failure["kind"] == "denied"
    assert failure["message"] == "not on a Friday" and failure["words_of"] == f"the approver {operator.username}"


@pytest.mark.spec("F7", "S20")
def test_oz_ask_is_a_tool_whose_answer_reaches_the_agent(harness_team: Team) -> None:
    run, thread = start_run(harness_team, _manifest("pa-ask", "asks"))
    wait_for(lambda: Task.objects.filter(run=run, key="r1.1", status="awaiting_input").exists(), timeout=SLOW, message="ask")
    kernel.answer(run_id=run.pk, key="r1.1", user=harness_team.users["operator"], value="oz0/main")
    thread.join(SLOW)
    run = _settled(run)
    assert run.status == "completed" and run.output == "answered: oz0/main"


@pytest.mark.spec("F7", "S29")
def test_a_cancel_reaches_the_pydantic_ai_run_within_two_seconds(harness_team: Team) -> None:
    record = RECORDS / "pydantic-slow.json"
    record.unlink(missing_ok=True)
    run, thread = start_run(harness_team, _manifest("pa-cancel", "slow"))
    wait_for(record.exists, timeout=SLOW, message="the model's request")
    asked = time.time()
    kernel.cancel_run(run_id=run.pk, user=harness_team.users["operator"], reason="stop")
    canceled = wait_for(lambda: json.loads(record.read_text() or "{}").get("canceled"), timeout=5, message="the run's cancel")
    assert canceled - asked < 2.0
    thread.join(SLOW)
    run = _settled(run)
    assert Task.objects.get(run=run, key="r1").error_key == "run_canceled" and run.status == "canceled"


@pytest.mark.spec("F7", "F9", "S22")
def test_a_crashing_model_fails_typed(harness_team: Team) -> None:
    run, thread = start_run(harness_team, _manifest("pa-broken", "broken"))
    thread.join(SLOW)
    round_task = Task.objects.get(run=run, key="r1")
    assert round_task.status == "failed" and round_task.error_key == "harness_crashed" and round_task.claim is None
    assert "the model exploded" in round_task.error_detail
    _, document = harness_team.api("viewer").get(f"/runs/{run.pk}")
    assert document["tasks"][0]["failure"]["kind"] == "error" and "exploded" not in str(document)


@pytest.mark.spec("F7", "F9", "S22")
def test_an_agent_the_install_no_longer_allows_or_finds_is_unavailable(harness_team: Team, settings: Any) -> None:
    """Lint refused such targets at registration; a version registered before the installer
    changed its lists fails typed at its next round."""
    register(_manifest("pa-gone", "echo"), workspace=harness_team.workspace)

    def round_of_a_new_run() -> Task:
        run, _ = kernel.create_run(
            workspace=harness_team.workspace, user=harness_team.users["operator"], body={"agent": "pa-gone"}
        )
        RoundThread(run).join(SLOW)
        return Task.objects.get(run=run, key="r1")

    settings.OZ0_HARNESS_MODULES = []
    round_task = round_of_a_new_run()
    assert round_task.error_key == "harness_unavailable" and round_task.claim is None, round_task.error_detail
    assert "OZ0_HARNESS_MODULES" in round_task.error_detail
    settings.OZ0_HARNESS_MODULES = ["oz0_test_pydantic_agents"]
    settings.OZ0_AGENT_PATH = []
    round_task = round_of_a_new_run()
    assert round_task.error_key == "harness_unavailable" and "cannot load" in round_task.error_detail, round_task.error_detail
    run = round_task.run
    _, document = harness_team.api("reader").get(f"/runs/{run.pk}")
    assert document["tasks"][0]["failure"]["kind"] == "unavailable"


@pytest.mark.spec("F7")
def test_the_agent_runs_in_a_confined_child_process_never_in_the_worker(harness_team: Team) -> None:
    run, thread = start_run(harness_team, _manifest("pa-where", "whereabouts"))
    thread.join(SLOW)
    run = _settled(run)
    assert run.status == "completed", Task.objects.get(run=run, key="r1").error_detail
    seen = json.loads(run.output)
    assert seen["pid"] != os.getpid() and seen["uid"] != 0 and seen["cwd"].startswith(tempfile.gettempdir())
    assert "DATABASE_URL" not in seen["env"] and "SECRET_KEY" not in seen["env"]
    assert "oz0_test_pydantic_agents" not in sys.modules and "pydantic_ai" not in sys.modules


@pytest.mark.spec("F7")
def test_what_the_agents_code_prints_goes_to_stderr_never_into_the_protocol(harness_team: Team) -> None:
    run, thread = start_run(harness_team, _manifest("pa-chatty", "chatty"))
    thread.join(SLOW)
    run = _settled(run)
    assert run.status == "completed" and run.output == "said my piece"
    stderr = Task.objects.get(run=run, key="r1").result["stderr"]
    assert "a print on stdout" in stderr and "and a write on descriptor 1" in stderr


@pytest.mark.spec("F7", "F9")
def test_an_agent_that_kills_its_process_takes_down_only_its_bridge(harness_team: Team) -> None:
    run, thread = start_run(harness_team, _manifest("pa-exits", "exits"))
    thread.join(SLOW)
    round_task = Task.objects.get(run=run, key="r1")
    assert round_task.error_key == "harness_crashed" and "exited with code 7" in round_task.error_detail


@pytest.mark.spec("F7", "S29")
def test_a_cancel_stops_an_agent_whose_own_tool_blocks(harness_team: Team) -> None:
    record = RECORDS / "pydantic-blocking.json"
    record.unlink(missing_ok=True)
    run, thread = start_run(harness_team, _manifest("pa-blocks", "blocks"))
    wait_for(record.exists, timeout=SLOW, message="the blocking tool")
    kernel.cancel_run(run_id=run.pk, user=harness_team.users["operator"], reason="stop")
    thread.join(SLOW)
    run = _settled(run)
    assert run.status == "canceled" and Task.objects.get(run=run, key="r1").error_key == "run_canceled"
    assert "finished" not in json.loads(record.read_text())  # stopped while its tool still blocked


@pytest.mark.spec("F7")
def test_changed_agent_code_is_loaded_at_the_next_round(harness_team: Team, settings: Any) -> None:
    folder = Path(tempfile.mkdtemp(prefix="oz0-test-agent-code-"))
    folder.chmod(0o755)
    module = folder / "oz0_test_reloaded.py"
    code = (
        "from pydantic_ai import Agent\n"
        "from pydantic_ai.models.function import FunctionModel\n"
        "from pydantic_ai.messages import ModelResponse, TextPart\n"
        "agent = Agent(FunctionModel(lambda messages, info: ModelResponse(parts=[TextPart({!r})])))\n"
    )
    settings.OZ0_HARNESS_MODULES = ["oz0_test_reloaded"]
    settings.OZ0_AGENT_PATH = [str(folder)]
    try:
        module.write_text(code.format("the first version"))
        first, thread = start_run(harness_team, harness_manifest("pa-reloaded", {"pydantic_ai": "oz0_test_reloaded:agent"}))
        thread.join(SLOW)
        module.write_text(code.format("the second version"))
        second, thread = start_run(harness_team, harness_manifest("pa-reloaded", {"pydantic_ai": "oz0_test_reloaded:agent"}))
        thread.join(SLOW)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert (_settled(first).output, _settled(second).output) == ("the first version", "the second version")


def _approval_run(team: Team, name: str) -> tuple[Run, Any, Task]:
    run, thread = start_run(team, _manifest(name, "approves", approval="ask"))
    call = wait_for(
        lambda: Task.objects.filter(run=run, key="r1.1", status="needs_approval").first(), timeout=SLOW, message="r1.1"
    )
    return run, thread, call


@pytest.mark.spec("F7", "S5", "S14")
def test_a_tool_that_requires_approval_waits_in_the_inbox_bound_to_its_digest_and_runs_once_approved(harness_team: Team) -> None:
    run, thread, call = _approval_run(harness_team, "pa-native-approve")
    args = {"branch": "release-1.2"}
    assert call.composed and call.spec == {"tool": "delete_branch", "args": args, "native": True}
    _, inbox = harness_team.api("operator").get(f"/inbox?workspace={harness_team.slug}")
    [item] = [i for i in inbox["items"] if i["run"] == str(run.pk)]
    assert (item["tool"], item["args"], item["digest"]) == ("delete_branch", args, call_digest("delete_branch", args))
    status, _ = harness_team.api("operator").post(f"/runs/{run.pk}/tasks/r1.1/approve", {"digest": item["digest"]})
    assert status == 200
    thread.join(SLOW)
    run = _settled(run)
    assert run.status == "completed" and run.output == "the tool said: deleted release-1.2"
    round_task = Task.objects.get(run=run, key="r1")
    assert "delete_branch ran for release-1.2" in round_task.result["stderr"]
    granted = Task.objects.get(run=run, key="r1.1")
    assert granted.status == "completed" and granted.approved_digest == item["digest"]


@pytest.mark.spec("F7", "S5", "S6", "F14")
def test_a_denied_approval_hands_the_agent_the_approvers_words_and_the_tool_never_runs(harness_team: Team) -> None:
    run, thread, _ = _approval_run(harness_team, "pa-native-deny")
    operator = harness_team.users["operator"]
    kernel.deny(run_id=run.pk, key="r1.1", user=operator, reason="not on a Friday")
    thread.join(SLOW)
    run = _settled(run)
    assert run.status == "completed" and run.output.startswith("the tool said: ")
    denial = json.loads(run.output.removeprefix("the tool said: "))
    assert denial["kind"] == "denied" and denial["message"] == "not on a Friday"
    assert denial["words_of"] == f"the approver {operator.username}"
    assert "delete_branch ran" not in Task.objects.get(run=run, key="r1").result.get("stderr", "")


@pytest.mark.spec("F7", "F6")
def test_the_example_pydantic_ai_agent_runs_offline(harness_team: Team) -> None:
    manifest = (ROOT / "oz0agents" / "examples" / "pydantic-triage.yaml").read_text()
    run, thread = start_run(harness_team, manifest, {"issue": 7})
    wait_for(lambda: Task.objects.filter(run=run, key="r1.1", ready=True).exists(), timeout=SLOW, message="clock")
    drive(run)
    thread.join(SLOW)
    run = _settled(run)
    assert run.status == "completed" and run.output.startswith('triaged; the clock said {"unix": ')
    failed, thread = start_run(harness_team, manifest, {"issue": 404})
    thread.join(SLOW)
    failed = _settled(failed)
    assert failed.status == "canceled" and failed.failure["kind"] == "not_found" and failed.failure["declared"] is True
