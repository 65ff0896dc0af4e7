"""The Pydantic AI harness (F7), offline on FunctionModel: oz.fail is the tool `oz__fail`, registry
tools and oz.ask are tools of oz0's toolset, and each goes through the kernel like oz0's own loop's."""

from __future__ import annotations

import json
import time

import pytest

from runs import kernel
from runs.models import Run, Task
from tests.conftest import ROOT, Team, wait_for
from tests.harness import pydantic_agents
from tests.harness.conftest import harness_manifest, start_run
from tests.runs.driver import drive


def _manifest(name: str, attribute: str, **kwargs: object) -> str:
    return harness_manifest(name, {"pydantic_ai": f"tests.harness.pydantic_agents:{attribute}"}, **kwargs)  # type: ignore[arg-type]


def _settled(run: Run) -> Run:
    run.refresh_from_db()
    return run


@pytest.mark.spec("F7", "F6", "F10", "F11", "F18")
def test_oz_fail_is_a_tool_that_ends_the_job_with_a_declared_kind(harness_team: Team) -> None:
    run, thread = start_run(harness_team, _manifest("pa-declared", "declared", tools=["test.echo"]), {"issue": 9})
    thread.join()
    run = _settled(run)
    assert pydantic_agents.SEEN["tools"] == ["oz__ask", "oz__fail", "test__echo"]
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
    thread.join()
    run = _settled(run)
    assert run.status == "canceled" and run.failure["kind"] == "undeclared" and run.failure["declared"] is False


@pytest.mark.spec("F7", "F6")
def test_a_message_of_2001_characters_is_refused(harness_team: Team) -> None:
    run, thread = start_run(harness_team, _manifest("pa-long", "too_long"))
    thread.join()
    run = _settled(run)
    round_task = Task.objects.get(run=run, key="r1")
    assert round_task.error_key == "round_expansion_refused" and "2001 characters" in round_task.error_detail
    assert (run.failure or {}).get("kind") != "not_found"


@pytest.mark.spec("F7", "S5", "S14")
def test_a_tool_call_under_ask_waits_in_the_inbox_and_its_approval_reaches_the_agent(harness_team: Team) -> None:
    run, thread = start_run(harness_team, _manifest("pa-approve", "echo", tools=["test.echo"], approval="ask"))
    wait_for(lambda: Task.objects.filter(run=run, key="r1.1", status="needs_approval").exists(), timeout=15, message="r1.1")
    _, inbox = harness_team.api("operator").get(f"/inbox?workspace={harness_team.slug}")
    assert [(i["kind"], i["task"], i["tool"]) for i in inbox["items"]] == [("approval", "r1.1", "test.echo")]
    kernel.approve(run_id=run.pk, key="r1.1", user=harness_team.users["operator"])
    drive(run)
    thread.join()
    run = _settled(run)
    assert run.status == "completed" and json.loads(run.output) == {"said": "hello"}
    # The tokens the FunctionModel reported for its two requests are billed on the round.
    assert Task.objects.get(run=run, key="r1").result["usage"] == {"input_tokens": 30, "output_tokens": 7, "calls": 2}


@pytest.mark.spec("F7", "S5", "S6", "F14")
def test_a_denial_reaches_the_agent_in_the_approvers_words(harness_team: Team) -> None:
    run, thread = start_run(harness_team, _manifest("pa-deny", "echo", tools=["test.echo"], approval="ask"))
    wait_for(lambda: Task.objects.filter(run=run, key="r1.1", status="needs_approval").exists(), timeout=15, message="r1.1")
    operator = harness_team.users["operator"]
    kernel.deny(run_id=run.pk, key="r1.1", user=operator, reason="not on a Friday")
    thread.join()
    run = _settled(run)
    failure = json.loads(run.output)
    assert run.status == "completed" and failure["failed"] is True and failure["kind"] == "denied"
    assert failure["message"] == "not on a Friday" and failure["words_of"] == f"the approver {operator.username}"


@pytest.mark.spec("F7", "S20")
def test_oz_ask_is_a_tool_whose_answer_reaches_the_agent(harness_team: Team) -> None:
    run, thread = start_run(harness_team, _manifest("pa-ask", "asks"))
    wait_for(lambda: Task.objects.filter(run=run, key="r1.1", status="awaiting_input").exists(), timeout=15, message="ask")
    kernel.answer(run_id=run.pk, key="r1.1", user=harness_team.users["operator"], value="oz0/main")
    thread.join()
    run = _settled(run)
    assert run.status == "completed" and run.output == "answered: oz0/main"


@pytest.mark.spec("F7", "S29")
def test_a_cancel_reaches_the_pydantic_ai_run_within_two_seconds(harness_team: Team) -> None:
    pydantic_agents.SEEN.pop("slow_canceled", None)
    pydantic_agents.SEEN.pop("slow_started", None)
    run, thread = start_run(harness_team, _manifest("pa-cancel", "slow"))
    wait_for(lambda: pydantic_agents.SEEN.get("slow_started"), timeout=15, message="the model's request")
    asked = time.time()
    kernel.cancel_run(run_id=run.pk, user=harness_team.users["operator"], reason="stop")
    canceled = wait_for(lambda: pydantic_agents.SEEN.get("slow_canceled"), timeout=5, message="the run's cancel")
    assert canceled - asked < 2.0
    thread.join()
    run = _settled(run)
    assert Task.objects.get(run=run, key="r1").error_key == "run_canceled" and run.status == "canceled"


@pytest.mark.spec("F7", "F9", "S22")
def test_a_crashing_model_fails_typed(harness_team: Team) -> None:
    run, thread = start_run(harness_team, _manifest("pa-broken", "broken"))
    thread.join()
    round_task = Task.objects.get(run=run, key="r1")
    assert round_task.status == "failed" and round_task.error_key == "harness_crashed" and round_task.claim is None
    assert "the model exploded" in round_task.error_detail
    _, document = harness_team.api("viewer").get(f"/runs/{run.pk}")
    assert document["tasks"][0]["failure"]["kind"] == "error" and "exploded" not in str(document)


@pytest.mark.spec("F7", "F9", "S22")
def test_an_agent_that_is_not_installed_or_not_an_agent_is_unavailable(harness_team: Team) -> None:
    for name, target in (
        ("pa-missing", "no_such_package.agents:agent"),
        ("pa-not-agent", "tests.harness.pydantic_agents:not_an_agent"),
    ):
        run, thread = start_run(harness_team, harness_manifest(name, {"pydantic_ai": target}))
        thread.join()
        round_task = Task.objects.get(run=run, key="r1")
        assert round_task.error_key == "harness_unavailable" and round_task.claim is None, round_task.error_detail
        _, document = harness_team.api("reader").get(f"/runs/{run.pk}")
        assert document["tasks"][0]["failure"]["kind"] == "unavailable"


@pytest.mark.spec("F7", "F6")
def test_the_example_pydantic_ai_agent_runs_offline(harness_team: Team) -> None:
    manifest = (ROOT / "agents" / "examples" / "pydantic-triage.yaml").read_text()
    run, thread = start_run(harness_team, manifest, {"issue": 7})
    wait_for(lambda: Task.objects.filter(run=run, key="r1.1", ready=True).exists(), timeout=15, message="clock")
    drive(run)
    thread.join()
    run = _settled(run)
    assert run.status == "completed" and run.output.startswith('triaged; the clock said {"unix": ')
    failed, thread = start_run(harness_team, manifest, {"issue": 404})
    thread.join()
    failed = _settled(failed)
    assert failed.status == "canceled" and failed.failure["kind"] == "not_found" and failed.failure["declared"] is True
