"""The JSON-lines harness (F7), offline: a process speaking protocol v1 runs an oz0 job whose
oz.fail, tool calls, questions, cancel and failures go through the kernel like oz0's own loop's."""

from __future__ import annotations

import time
from typing import Any

import pytest

from runs import kernel
from runs.models import Run, Task, TraceEvent
from tests.conftest import Team, wait_for
from tests.harness.conftest import jsonl_manifest, record_path, records, start_run
from tests.runs.driver import drive


def _settled(run: Run) -> Run:
    run.refresh_from_db()
    return run


@pytest.mark.spec("F7", "F6", "F10", "F11", "F18")
def test_it_ends_the_job_with_a_declared_kind_the_scorecard_counts_and_a_viewer_sees_without_words(
    harness_team: Team,
) -> None:
    manifest = jsonl_manifest("jl-declared", [{"fail": {"kind": "not_found", "message": "issue 9 is not in the tracker"}}])
    run, thread = start_run(harness_team, manifest, {"issue": 9})
    thread.join()
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
    round_task = Task.objects.get(run=run, key="r1")
    assert round_task.status == "failed" and round_task.error_key == "oz_fail" and round_task.claim is None
    status, card = harness_team.api("viewer").get(f"/insights/agents/jl-declared?workspace={harness_team.slug}")
    assert status == 200 and card["failed"] == 1 and [k["kind"] for k in card["by_kind"]] == ["not_found"], card
    status, document = harness_team.api("viewer").get(f"/runs/{run.pk}")
    assert status == 200
    assert document["failure"]["kind"] == "not_found" and document["failure"]["declared"] is True
    assert document["failure"]["person"] is True and document["failure"]["message"] is None
    assert "tracker" not in str(document)
    _, as_reader = harness_team.api("reader").get(f"/runs/{run.pk}")
    assert as_reader["failure"]["message"] == "issue 9 is not in the tracker"


@pytest.mark.spec("F7", "F6", "F9")
def test_a_kind_the_agent_does_not_declare_ends_the_job_undeclared(harness_team: Team) -> None:
    run, thread = start_run(harness_team, jsonl_manifest("jl-undeclared", [{"fail": {"kind": "gone_fishing", "message": "bye"}}]))
    thread.join()
    run = _settled(run)
    assert run.status == "canceled"
    assert run.failure["kind"] == "undeclared" and run.failure["declared"] is False and run.failure["partial"] is True


@pytest.mark.spec("F7", "F6")
def test_a_message_of_2001_characters_is_refused(harness_team: Team) -> None:
    run, thread = start_run(harness_team, jsonl_manifest("jl-long", [{"fail": {"kind": "not_found", "message": "x" * 2001}}]))
    thread.join()
    run = _settled(run)
    round_task = Task.objects.get(run=run, key="r1")
    assert round_task.status == "failed" and round_task.error_key == "round_expansion_refused"
    assert "2001 characters" in (round_task.error_detail or "")
    # The kind never became the run's: the refused oz.fail holds the run like any failed round.
    assert run.status == "needs_attention" and (run.failure or {}).get("kind") != "not_found"


@pytest.mark.spec("F7", "F6")
def test_a_message_of_2000_characters_is_accepted(harness_team: Team) -> None:
    run, thread = start_run(harness_team, jsonl_manifest("jl-cap", [{"fail": {"kind": "not_found", "message": "x" * 2000}}]))
    thread.join()
    run = _settled(run)
    assert run.status == "canceled" and run.failure["kind"] == "not_found" and len(run.failure["message"]) == 2000


def _approval_run(team: Team, name: str) -> tuple[Run, Any, Task]:
    script = [{"call": "test.echo", "args": {"value": {"said": "hello"}}}, {"done": "$last"}]
    run, thread = start_run(team, jsonl_manifest(name, script, tools=["test.echo"], approval="ask"))
    call = wait_for(
        lambda: Task.objects.filter(run=run, key="r1.1", status="needs_approval").first(), timeout=15, message="r1.1 waits"
    )
    return run, thread, call


@pytest.mark.spec("F7", "S5", "S14")
def test_a_tool_call_under_ask_waits_in_the_inbox_and_its_approval_reaches_the_agent(harness_team: Team) -> None:
    run, thread, call = _approval_run(harness_team, "jl-approve")
    assert call.composed and call.spec == {"tool": "test.echo", "args": {"value": {"said": "hello"}}}
    status, inbox = harness_team.api("operator").get(f"/inbox?workspace={harness_team.slug}")
    assert status == 200
    assert [(i["kind"], i["task"], i["tool"]) for i in inbox["items"]] == [("approval", "r1.1", "test.echo")]
    run.refresh_from_db()
    assert run.status == "running" and "approval_required" in run.announcements
    assert Task.objects.get(run=run, key="r1").status == "running"
    kernel.approve(run_id=run.pk, key="r1.1", user=harness_team.users["operator"])
    drive(run)  # the approved call runs on a worker of its own
    thread.join()
    run = _settled(run)
    assert run.status == "completed"
    assert run.output == {"type": "result", "id": "c", "ok": True, "value": {"said": "hello"}}
    events = list(TraceEvent.objects.filter(run=run).values_list("task_key", "event", "to_status"))
    assert ("r1", "harness_call", None) in events and ("r1.1", "status", "needs_approval") in events


@pytest.mark.spec("F7", "S5", "S6", "F14")
def test_a_denied_call_reaches_the_agent_in_the_approvers_words(harness_team: Team) -> None:
    run, thread, _ = _approval_run(harness_team, "jl-deny")
    operator = harness_team.users["operator"]
    kernel.deny(run_id=run.pk, key="r1.1", user=operator, reason="not on a Friday")
    thread.join()
    run = _settled(run)
    assert run.status == "completed", run.attention
    result = run.output
    assert result["ok"] is False
    failure = result["failure"]
    assert failure["kind"] == "denied" and failure["message"] == "not on a Friday"
    assert failure["words_of"] == f"the approver {operator.username}"


@pytest.mark.spec("F7", "S20", "S9")
def test_oz_ask_waits_for_a_person_and_the_answer_reaches_the_agent(harness_team: Team) -> None:
    run, thread = start_run(harness_team, jsonl_manifest("jl-ask", [{"ask": "Which repo?"}, {"done": "$last"}]))
    wait_for(lambda: Task.objects.filter(run=run, key="r1.1", status="awaiting_input").exists(), timeout=15, message="ask")
    run.refresh_from_db()
    assert "awaiting_human" in run.announcements and run.attention["blocked_task_keys"] == ["r1.1"]
    kernel.answer(run_id=run.pk, key="r1.1", user=harness_team.users["operator"], value="oz0/main")
    thread.join()
    run = _settled(run)
    assert run.status == "completed" and run.output["value"] == "oz0/main"


@pytest.mark.spec("F7", "S6", "S29")
def test_a_cancel_reaches_the_harness_within_two_seconds(harness_team: Team) -> None:
    record = record_path()
    run, thread = start_run(harness_team, jsonl_manifest("jl-cancel", [{"wait": True}], record=record))
    wait_for(lambda: records(record), timeout=15, message="the harness's start")
    asked = time.time()
    kernel.cancel_run(run_id=run.pk, user=harness_team.users["operator"], reason="stop it")
    cancel = wait_for(lambda: [m for m in records(record) if m["type"] == "cancel"], timeout=5, message="the cancel line")
    assert cancel[0]["at"] - asked < 2.0
    thread.join()
    run = _settled(run)
    round_task = Task.objects.get(run=run, key="r1")
    assert round_task.status == "canceled" and round_task.error_key == "run_canceled" and round_task.claim is None
    assert run.status == "canceled" and run.failure["kind"] == "cancelled"


@pytest.mark.spec("F7", "S29")
def test_a_harness_that_ignores_the_cancel_line_is_terminated(harness_team: Team) -> None:
    record = record_path()
    run, thread = start_run(harness_team, jsonl_manifest("jl-stubborn", [{"wait": True, "ignore_cancel": True}], record=record))
    wait_for(lambda: records(record), timeout=15, message="the harness's start")
    asked = time.monotonic()
    kernel.cancel_run(run_id=run.pk, user=harness_team.users["operator"], reason="")
    thread.join(timeout=10)
    assert time.monotonic() - asked < 6  # the cancel line's grace, then SIGTERM ends it (the script sleeps 60 s)
    run = _settled(run)
    assert run.status == "canceled" and Task.objects.get(run=run, key="r1").error_key == "run_canceled"


@pytest.mark.spec("F7", "F9", "F11", "S22")
def test_a_crashed_harness_fails_typed_with_its_stderr_kept_as_words(harness_team: Team) -> None:
    script = [{"crash": 3, "stderr": "Traceback: token=abc123 exploded"}]
    run, thread = start_run(harness_team, jsonl_manifest("jl-crash", script))
    thread.join()
    run = _settled(run)
    round_task = Task.objects.get(run=run, key="r1")
    assert round_task.status == "failed" and round_task.error_key == "harness_crashed" and round_task.claim is None
    assert "exited with code 3" in round_task.error_detail and "exploded" in round_task.error_detail
    assert "token=abc123 exploded" in round_task.result["stderr"]
    _, document = harness_team.api("reader").get(f"/runs/{run.pk}")
    assert document["tasks"][0]["failure"]["kind"] == "error"
    assert "exploded" in document["tasks"][0]["result"]["stderr"]
    _, as_viewer = harness_team.api("viewer").get(f"/runs/{run.pk}")
    assert as_viewer["tasks"][0]["failure"]["kind"] == "error" and "abc123" not in str(as_viewer)


@pytest.mark.spec("F7", "F9", "S22")
def test_a_malformed_json_line_fails_typed(harness_team: Team) -> None:
    run, thread = start_run(
        harness_team,
        jsonl_manifest(
            "jl-garbage",
            [{"raw": "{not json"}],
        ),
    )
    thread.join()
    round_task = Task.objects.get(run=run, key="r1")
    assert round_task.status == "failed" and round_task.error_key == "harness_protocol_error"
    assert "not JSON" in round_task.error_detail and round_task.claim is None


@pytest.mark.spec("F7", "S22")
def test_a_message_of_an_unknown_type_fails_typed(harness_team: Team) -> None:
    run, thread = start_run(harness_team, jsonl_manifest("jl-unknown", [{"raw": '{"type": "shout"}'}]))
    thread.join()
    assert Task.objects.get(run=run, key="r1").error_key == "harness_protocol_error"


@pytest.mark.spec("F7", "F9", "S22")
def test_a_harness_that_is_not_installed_is_unavailable(harness_team: Team) -> None:
    run, thread = start_run(harness_team, jsonl_manifest("jl-missing", [], program="not-installed"))
    thread.join()
    run = _settled(run)
    round_task = Task.objects.get(run=run, key="r1")
    assert round_task.status == "failed" and round_task.error_key == "harness_unavailable" and round_task.claim is None
    _, document = harness_team.api("reader").get(f"/runs/{run.pk}")
    assert document["tasks"][0]["failure"]["kind"] == "unavailable"


@pytest.mark.spec("F7")
def test_the_usage_the_harness_reports_is_billed_on_the_task(harness_team: Team) -> None:
    script = [{"done": "fine", "usage": {"input_tokens": 12, "output_tokens": 5}}]
    run, thread = start_run(harness_team, jsonl_manifest("jl-usage", script))
    thread.join()
    run = _settled(run)
    assert run.status == "completed" and run.output == "fine"
    assert Task.objects.get(run=run, key="r1").result["usage"] == {"input_tokens": 12, "output_tokens": 5, "calls": 1}
    _, document = harness_team.api("viewer").get(f"/runs/{run.pk}")
    assert document["tasks"][0]["result"]["usage"] == {"input_tokens": 12, "output_tokens": 5, "calls": 1}


@pytest.mark.spec("F7")
def test_a_tool_the_agent_does_not_list_is_refused_to_the_agent(harness_team: Team) -> None:
    script = [{"call": "test.sleep", "args": {"seconds": 0}}, {"done": "$last"}]
    run, thread = start_run(harness_team, jsonl_manifest("jl-unlisted", script, tools=["test.echo"]))
    thread.join()
    run = _settled(run)
    assert run.status == "completed" and run.output["ok"] is False
    assert "does not list" in run.output["failure"]["message"]
    assert not Task.objects.filter(run=run, key="r1.1").exists()


@pytest.mark.spec("F7", "F6")
def test_the_example_harness_reads_the_clock_through_oz0_and_fails_with_its_declared_kind(harness_team: Team) -> None:
    from tests.conftest import ROOT

    manifest = (ROOT / "oz0agents" / "examples" / "jsonl-triage.yaml").read_text()
    run, thread = start_run(harness_team, manifest, {"issue": 7})
    wait_for(lambda: Task.objects.filter(run=run, key="r1.1", status="waiting", ready=True).exists(), timeout=15, message="clock")
    drive(run)  # the rules allowed clock.now: it crossed the approval stage without resting
    thread.join()
    run = _settled(run)
    assert run.status == "completed" and run.output.startswith("issue 7 triaged at unix time ")
    assert Task.objects.get(run=run, key="r1").result["stderr"].startswith(f"job {run.pk}: issue 7")
    failed, thread = start_run(harness_team, manifest, {"issue": 404})
    thread.join()
    failed = _settled(failed)
    assert failed.status == "canceled" and failed.failure["kind"] == "not_found" and failed.failure["declared"] is True


@pytest.mark.spec("F7", "S29")
def test_a_call_made_while_the_run_is_paused_waits_for_the_resume(harness_team: Team) -> None:
    script = [{"ask": "go on?"}, {"call": "test.echo", "args": {"value": "after the pause"}}, {"done": "$last"}]
    run, thread = start_run(harness_team, jsonl_manifest("jl-paused", script, tools=["test.echo"]))
    wait_for(lambda: Task.objects.filter(run=run, key="r1.1", status="awaiting_input").exists(), timeout=15, message="ask")
    operator = harness_team.users["operator"]
    kernel.pause_run(run_id=run.pk, user=operator)
    kernel.answer(run_id=run.pk, key="r1.1", user=operator, value="yes")
    call = wait_for(lambda: Task.objects.filter(run=run, key="r1.2").first(), timeout=15, message="the call")
    time.sleep(0.5)
    call.refresh_from_db()
    assert call.status == "waiting" and _settled(run).status == "paused"
    assert Task.objects.get(run=run, key="r1").status == "running"
    kernel.resume_run(run_id=run.pk, user=operator)
    drive(run)
    thread.join()
    run = _settled(run)
    assert run.status == "completed" and run.output["value"] == "after the pause"


@pytest.mark.spec("F7", "S5")
def test_oz_approval_under_bypass_is_granted_at_once_bound_to_the_calls_digest(harness_team: Team) -> None:
    args = {"path": "/srv/app", "force": True}
    script = [{"call": "oz.approval", "args": {"tool": "wipe_cache", "args": args}}, {"done": "$last"}]
    run, thread = start_run(harness_team, jsonl_manifest("jl-native-bypass", script))
    thread.join()
    run = _settled(run)
    digest = kernel.call_digest("wipe_cache", args)
    assert run.status == "completed" and run.output["value"] == {"approved": True, "digest": digest}
    granted = Task.objects.get(run=run, key="r1.1")
    assert (granted.kind, granted.status, granted.spec["native"], granted.approved_digest) == ("tool", "completed", True, digest)
    event = TraceEvent.objects.get(run=run, task_key="r1.1", event="approval_granted")
    assert event.data == {"by": "bypass", "digest": digest}


@pytest.mark.spec("F7", "S22")
def test_an_approval_oz0_cannot_make_is_refused_to_the_agent(harness_team: Team) -> None:
    for index, asked in enumerate(
        [
            {"tool": "oz.fail", "args": {}},
            {"tool": "", "args": {}},
            {"tool": "x" * 201, "args": {}},
            {"tool": "wipe", "args": "everything"},
            {"tool": "wipe", "args": {"a": "\u0000"}},
            {"args": {}},
        ]
    ):
        run, thread = start_run(
            harness_team, jsonl_manifest(f"jl-native-bad-{index}", [{"call": "oz.approval", "args": asked}, {"done": "$last"}])
        )
        thread.join()
        run = _settled(run)
        assert run.status == "completed" and run.output["ok"] is False, (asked, run.output)
        assert run.output["failure"]["error"] == "round_expansion_refused", asked
        assert not Task.objects.filter(run=run, key="r1.1").exists(), asked
