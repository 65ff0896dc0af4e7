"""oz.fail is the agent's only when its `tools:` list it (F6): oz0's own loop offers it to the model
only then, and a round that calls it anyway fails `round_expansion_refused` instead of ending the
job with the kind it named; lint's warning about `failures:` without `oz.fail` says so (F8)."""

from __future__ import annotations

from typing import Any

import pytest

from oz0agents.lint import lint
from oz0agents.registry import register
from runs import kernel
from runs.models import Run, TraceEvent
from tests.conftest import Team
from tests.runs.driver import drive, task

KINDS = "failures:\n  - kind: not_found\n    description: The issue does not exist\n"
SCRIPT = "script:\n  - oz_fail: {kind: not_found, message: issue 9 is gone}\n"


def agent_run(team: Team, name: str, tools: str) -> Run:
    register(f"name: {name}\nmodel: script\ninstructions: Triage.\n{tools}{KINDS}{SCRIPT}", workspace=team.workspace)
    run, _ = kernel.create_run(
        workspace=team.workspace, user=team.users["operator"], body={"agent": name, "approval": {"mode": "bypass"}}
    )
    return drive(run)


def raw_run(team: Team, **round_: Any) -> Run:
    spec = {"key": "r1", "kind": "round", "model": "script", "prompt": "go", **round_}
    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={"tasks": [spec], "deliverable": "r1", "approval": {"mode": "bypass"}},
    )
    return drive(run)


def offered_tools(run: Run) -> list[str]:
    event = TraceEvent.objects.filter(run=run, event="provider_call").order_by("seq").first()
    assert event is not None
    return list(event.data["request"]["tools"])


@pytest.mark.spec("F6", "F1")
def test_an_agent_that_does_not_list_oz_fail_is_not_offered_it_and_its_call_is_refused(team: Team) -> None:
    run = agent_run(team, "unlisted-fail", "tools: [clock.now]\n")
    assert "oz.fail" not in offered_tools(run)
    r1 = task(run, "r1")
    assert (r1.status, r1.error_key) == ("failed", "round_expansion_refused")
    assert "oz.fail" in (r1.error_detail or "") and "tools" in (r1.error_detail or "")
    # The job did not end with the kind the agent named: the refused round holds it, kind model.
    assert run.status == "needs_attention"
    assert run.failure is not None and (run.failure["kind"], run.failure["declared"]) == ("model", False)


@pytest.mark.spec("F6", "F1")
def test_an_agent_that_lists_oz_fail_is_offered_it_and_ends_the_job_with_its_kind(team: Team) -> None:
    run = agent_run(team, "listed-fail", "tools: [oz.fail, clock.now]\n")
    assert "oz.fail" in offered_tools(run)
    assert run.status == "canceled"
    assert run.failure is not None and (run.failure["kind"], run.failure["declared"]) == ("not_found", True)


@pytest.mark.spec("F6")
def test_a_round_of_the_api_honours_oz_fail_only_when_its_tools_list_it(team: Team) -> None:
    script = [{"oz_fail": {"kind": "not_found", "message": "gone"}}]
    unlisted = raw_run(team, script=script)
    assert task(unlisted, "r1").error_key == "round_expansion_refused" and unlisted.status == "needs_attention"
    as_a_call = raw_run(team, script=[{"tool_calls": [{"tool": "oz.fail", "args": {"kind": "x", "message": "m"}}]}])
    assert task(as_a_call, "r1").error_key == "round_expansion_refused"
    listed = raw_run(team, script=script, tools=["oz.fail"])
    assert listed.status == "canceled" and listed.failure is not None and listed.failure["kind"] == "undeclared"


@pytest.mark.spec("F8", "F6")
def test_lints_warning_about_failures_without_oz_fail_says_what_then_happens() -> None:
    linted = lint(f"name: a\nmodel: script\ntools: [clock.now]\n{KINDS}")
    assert linted.errors == [] and [w.field for w in linted.warnings] == ["failures"]
    message = linted.warnings[0].message
    assert "oz.fail" in message and "round_expansion_refused" in message
