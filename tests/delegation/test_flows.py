"""Flows (F5, F17): steps run by agents as child runs, a later step's `when:` guard reading an
earlier step's failure (error branches), lint with line numbers, and a flow as a parent's tool."""

from __future__ import annotations

from typing import Any

import pytest

from runs import kernel
from runs.kernel import GuardError
from runs.models import Run, Task
from tests.conftest import Team
from tests.delegation.tree import agent, create, drive_tree, requests, tool_answer

pytestmark = pytest.mark.usefixtures("no_dispatch")


def fetcher(team: Team, *, fails: bool) -> str:
    if fails:
        return agent(
            team.workspace,
            "model: script\ntools: [oz.fail]\nfailures:\n  - kind: no_invoice\n    description: No invoice\n    person: true\n"
            "approval: {mode: bypass}\nscript:\n  - oz_fail: {kind: no_invoice, message: nothing under that number}\n",
            prefix="fetch",
        )
    return agent(team.workspace, "model: script\napproval: {mode: bypass}\nscript:\n  - text: invoice 7 found\n", prefix="fetch")


def saying(team: Team, text: str) -> str:
    return agent(team.workspace, f"model: script\napproval: {{mode: bypass}}\nscript:\n  - text: {text}\n", prefix="say")


def branching_flow(team: Team, fetch: str) -> str:
    return agent(
        team.workspace,
        "kind: flow\ndescription: Fetch, then report or summarize\nsteps:\n"
        f"  - id: fetch\n    agent: {fetch}\n    input: {{invoice: 7}}\n"
        f"  - id: report\n    agent: {saying(team, 'reported')}\n    after: [fetch]\n"
        "    when: \"steps.fetch.failure.kind == 'no_invoice' and steps.fetch.failure.person\"\n"
        f"  - id: summarize\n    agent: {saying(team, 'summarized')}\n    after: [fetch]\n"
        "    when: steps.fetch.failure == null\n",
        prefix="flow",
    )


@pytest.mark.spec("F17")
def test_a_flows_error_branch_runs_and_its_success_branch_is_skipped(team: Team, django_capture_on_commit_callbacks: Any) -> None:
    flow = create(team.workspace, team.users["operator"], agent=branching_flow(team, fetcher(team, fails=True)))
    flow = drive_tree(flow, django_capture_on_commit_callbacks)
    assert (flow.status, flow.output) == ("completed", "reported")
    steps = {t.key: t for t in Task.objects.filter(run=flow)}
    assert (steps["fetch"].status, steps["fetch"].error_key) == ("failed", "child_failed")
    assert steps["report"].status == "completed"
    assert (steps["summarize"].status, steps["summarize"].error_key) == ("skipped", "condition_false")
    assert steps["summarize"].child_id is None
    assert Run.objects.filter(parent=flow).count() == 2


@pytest.mark.spec("F17")
def test_a_flows_success_branch_runs_when_the_step_succeeded(team: Team, django_capture_on_commit_callbacks: Any) -> None:
    flow = create(team.workspace, team.users["operator"], agent=branching_flow(team, fetcher(team, fails=False)))
    flow = drive_tree(flow, django_capture_on_commit_callbacks)
    assert (flow.status, flow.output) == ("completed", "summarized")
    assert Task.objects.get(run=flow, key="report").status == "skipped"


@pytest.mark.spec("F5", "F1")
def test_a_flow_fails_with_its_failing_steps_agents_kind(team: Team, django_capture_on_commit_callbacks: Any) -> None:
    name = agent(team.workspace, f"kind: flow\nsteps:\n  - id: only\n    agent: {fetcher(team, fails=True)}\n", prefix="flow")
    flow = drive_tree(create(team.workspace, team.users["operator"], agent=name), django_capture_on_commit_callbacks)
    assert flow.status == "canceled"
    assert flow.failure["kind"] == "no_invoice" and flow.failure["declared"] is True and flow.failure["person"] is True


@pytest.mark.spec("F14", "F17")
def test_a_failed_flow_is_the_flow_tools_answer(team: Team, django_capture_on_commit_callbacks: Any) -> None:
    failing = agent(team.workspace, f"kind: flow\nsteps:\n  - id: only\n    agent: {fetcher(team, fails=True)}\n", prefix="flow")
    boss = agent(
        team.workspace,
        "model: script\ntools: [oz.flow]\napproval: {mode: bypass}\nscript:\n"
        f"  - tool_calls: [{{tool: oz.flow, args: {{flow: {failing}}}}}]\n  - text: went on\n",
    )
    parent = drive_tree(create(team.workspace, team.users["operator"], agent=boss), django_capture_on_commit_callbacks)
    assert (parent.status, parent.output) == ("completed", "went on")
    child = Run.objects.get(parent=parent)
    label = tool_answer(requests(parent)[1], "oz.flow")["label"]
    assert label["failed"] is True and label["kind"] == "no_invoice" and label["declared"] is True
    assert label["words_of"] == f"the agent {failing} (job {child.pk})"


@pytest.mark.spec("F5", "F17")
def test_flow_lint_names_each_problem_with_its_line(team: Team) -> None:
    manifest = "\n".join(
        [
            "name: broken-flow",  # 1
            "kind: flow",  # 2
            "failures:",  # 3
            "  - {kind: x, description: y}",  # 4
            "steps:",  # 5
            "  - id: Fetch",  # 6
            "    agent: a",  # 7
            "  - id: report",  # 8
            "    agent: b",  # 9
            "    after: [missing]",  # 10
            "  - id: judge",  # 11
            "    agent: c",  # 12
            "    when: __import__('os').system('true')",  # 13
            "  - id: peek",  # 14
            "    agent: d",  # 15
            "    when: steps.report.output == 1",  # 16
        ]
    )
    status, body = team.api().post("/agents/lint", {"manifest": manifest, "workspace": team.slug})
    assert status == 200
    found = {(e["line"], e["field"]) for e in body["errors"]}
    assert {(3, "failures"), (6, "steps[0].id"), (10, "steps[1].after"), (13, "steps[2].when"), (16, "steps[3].when")} <= found
    status, body = team.api().post("/agents", {"manifest": manifest, "workspace": team.slug})
    assert status == 400


def test_guards_are_parsed_by_a_whitelist_never_evaluated() -> None:
    for bad in (
        "__import__('os')",
        "steps.a.output.__class__ + 1",
        "open('x')",
        "steps.a.secret",
        "1 +",
        "lambda: 1",
        "(" * 200 + "1" + ")" * 200,
        "not " * 100 + "true",
    ):
        with pytest.raises(GuardError):
            kernel.parse_guard(bad)
    node = kernel.parse_guard("not (steps.a.failure.kind in 'x y') or steps.a.output >= 2")
    assert kernel.guard_steps(node) == {"a"}
    guard = kernel.parse_guard("steps.a.failure.kind == 'no_invoice' and not steps.a.failure.retryable")
    assert kernel.evaluate_guard(guard, {"a": {"failure": {"kind": "no_invoice", "retryable": False}}}) is True
    assert kernel.evaluate_guard(guard, {"a": {"failure": None, "output": 3}}) is False
    assert kernel.evaluate_guard(kernel.parse_guard("steps.a.output > 'x'"), {"a": {"output": 3}}) is False
