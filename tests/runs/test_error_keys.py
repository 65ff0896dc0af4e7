"""S22's keys where the seed's meaning applies to oz0, oz.fail calls that cannot be read, and a
denied call read by the model in its approver's words (F6, F14)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runs import failures, kernel
from runs.models import Run, Task, TraceEvent
from tests.conftest import Team
from tests.runs.driver import drive, step, task


def round_run(team: Team, approval: str = "bypass", **round_: Any) -> Run:
    spec = {"key": "r1", "kind": "round", "model": "script", "prompt": "go", "on_failure": "halt", **round_}
    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={"tasks": [spec], "deliverable": "r1", "approval": {"mode": approval}},
    )
    return run


def provider_calls(run: Run) -> int:
    return TraceEvent.objects.filter(run=run, event="provider_call").count()


@pytest.mark.spec("F6", "S22")
@pytest.mark.parametrize(
    "answer",
    [
        {"oz_fail": {"message": "no kind at all"}},
        {"oz_fail": {"kind": 404, "message": "a number"}},
        {"oz_fail": {"kind": "", "message": "an empty kind"}},
        {"oz_fail": {"kind": "   ", "message": "a blank kind"}},
        {"tool_calls": [{"tool": "oz.fail", "args": {"message": "no kind"}}]},
        {"tool_calls": [{"tool": "oz.fail", "args": "not_found"}]},
    ],
)
def test_it_refuses_an_oz_fail_without_a_kind_as_a_round_expansion(team: Team, answer: dict[str, Any]) -> None:
    run = drive(round_run(team, script=[answer], tools=["oz.fail"]))
    r1 = task(run, "r1")
    assert (r1.status, r1.error_key) == ("failed", "round_expansion_refused")
    assert "without a kind" in (r1.error_detail or "")
    assert run.status == "needs_attention" and run.failure is not None and run.failure["kind"] == "model"
    # The refused answer is not the conversation's last word: a retry asks the model again.
    assert r1.state["history"][-1]["role"] == "user"


@pytest.mark.spec("F6")
def test_it_still_ends_a_run_undeclared_for_a_kind_the_agent_does_not_declare(team: Team) -> None:
    run = drive(round_run(team, script=[{"oz_fail": {"kind": "no_such_kind", "message": "words"}}], tools=["oz.fail"]))
    assert run.status == "canceled" and run.failure["kind"] == "undeclared"


def told(run: Run, key: str) -> dict[str, Any]:
    message = next(m for m in task(run, "r1").state["history"] if m.get("role") == "tool" and m.get("id") == key)
    return json.loads(message["content"])


@pytest.mark.spec("F14", "S6")
def test_it_labels_a_denied_call_as_its_approvers_words(team: Team) -> None:
    script = [{"tool_calls": [{"tool": "test.echo", "args": {"value": 1}}]}, {"text": "done"}]
    run = drive(round_run(team, approval="ask", script=script, on_failure="propagate"))
    operator = team.users["operator"]
    kernel.deny(run_id=run.pk, key="r1.1", user=operator, reason="not on a Friday")
    run = drive(run)
    assert run.status == "completed"
    label = told(run, "r1.1")
    assert label["words_of"] == f"the approver {operator.username}"
    assert (label["message"], label["kind"], label["error"]) == ("not on a Friday", "denied", "approval_denied")


@pytest.mark.spec("F14", "S5")
def test_it_labels_a_call_the_rules_denied_as_the_rules_words(team: Team) -> None:
    script = [{"tool_calls": [{"tool": "test.echo", "args": {"value": 1}}]}, {"text": "done"}]
    spec = {"key": "r1", "kind": "round", "model": "script", "prompt": "go", "script": script}
    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={"tasks": [spec], "approval": {"mode": "rules", "rules": [{"tool": "test.*", "decision": "deny"}]}},
    )
    run = drive(run)
    assert told(run, "r1.1")["words_of"] == "the approval rules"


@pytest.mark.spec("S22")
def test_it_fails_a_round_declaring_tools_on_a_lane_without_tool_calls(team: Team, settings: Any) -> None:
    settings.OZ0_PROVIDERS = {"plain": {"api": "openai", "base_url": "http://127.0.0.1:9", "tool_calls": False}}
    run = drive(round_run(team, model="plain:small", tools=["test.echo"]))
    r1 = task(run, "r1")
    assert (r1.status, r1.error_key) == ("failed", "model_capability_unavailable")
    assert failures.kind_for_error_key(r1.error_key) == "unavailable"
    assert provider_calls(run) == 0


@pytest.mark.spec("S22", "S23")
def test_it_fails_a_request_over_the_storage_bound_as_context_overflow_and_compacts_it(team: Team) -> None:
    big = "x" * 600_000
    script = [{"tool_calls": [{"tool": "test.echo", "args": {"value": big}}]}, {"text": "after compaction"}]
    run = drive(round_run(team, script=script))
    r1 = task(run, "r1")
    assert (r1.status, r1.error_key) == ("failed", "context_overflow")
    assert failures.kind_for_error_key(r1.error_key) == "limit"
    assert provider_calls(run) == 1  # the over-long request never left
    assert run.status == "needs_attention"
    kernel.compact(run_id=run.pk, key="r1", user=team.users["operator"])
    run = drive(run)
    assert run.status == "completed" and run.output == "after compaction"


@pytest.mark.spec("S22")
def test_it_fails_a_round_with_nothing_to_ask_as_missing_input(team: Team) -> None:
    run = drive(round_run(team, prompt="", script=[{"text": "never"}]))
    r1 = task(run, "r1")
    assert (r1.status, r1.error_key) == ("failed", "missing_input")
    assert failures.kind_for_error_key(r1.error_key) == "invalid_input"
    assert provider_calls(run) == 0


@pytest.mark.spec("S22")
def test_it_fails_a_round_whose_source_is_gone_as_input_source_unavailable(team: Team) -> None:
    script = [{"tool_calls": [{"tool": "test.echo", "args": {"value": 1}}]}, {"text": "never"}]
    run = round_run(team, script=script)
    assert step(run, task(run, "r1")) and step(run, task(run, "r1.1"))
    assert task(run, "r1").ready
    Task.objects.filter(run=run, key="r1.1").delete()  # retention took the call's row
    run = drive(run)
    r1 = task(run, "r1")
    assert (r1.status, r1.error_key) == ("failed", "input_source_unavailable")
    assert failures.kind_for_error_key(r1.error_key) == "unavailable"


@pytest.mark.spec("S8", "S22")
def test_it_fails_a_client_await_its_token_holder_reports_failed(team: Team) -> None:
    status, created = team.api().post(
        f"/workspaces/{team.slug}/runs",
        {"tasks": [{"key": "ci", "kind": "await", "question": "did CI pass?", "on_failure": "halt"}], "deliverable": "ci"},
    )
    assert status == 201
    token = created["receipt"]["tokens"]["ci"]
    for body in ({"error": ""}, {"error": 5}, {"value": 1, "error": "both"}):
        status, refused = team.api().post(f"/awaits/{token}", body)
        assert 400 <= status < 500 and refused["error"]["key"], body
    status, done = team.api().post(f"/awaits/{token}", {"error": "the CI job failed"})
    assert status == 200
    ci = next(t for t in done["run"]["tasks"] if t["key"] == "ci")
    assert (ci["status"], ci["error"]["key"], ci["failure"]["kind"]) == ("failed", "await_failed", "error")
    assert done["run"]["status"] == "needs_attention"
    status, again = team.api().post(f"/awaits/{token}", {"value": 1})
    assert status == 409 and again["error"]["key"] == "not_pending"
