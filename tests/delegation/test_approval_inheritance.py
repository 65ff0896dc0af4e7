"""A child run never escapes its parent's approval mode (S5, F14-F17): a delegate, an Ask agent, a
quarantine and a flow step run under the stricter of their parent's mode and their own, decided per
call (a denial beats a person, a person beats an allow), and the trace says whose mode decided."""

from __future__ import annotations

from typing import Any

import pytest

from runs import kernel
from runs.kernel import call_decision
from runs.models import Run, Task, TraceEvent
from tests.conftest import Team
from tests.delegation.tree import agent, child_of, create, drive_tree

pytestmark = pytest.mark.usefixtures("no_dispatch")

EFFECT_CALL = "  - tool_calls: [{tool: test.effect, args: {id: child-effect}}]\n  - text: did it\n"


def acting_child(team: Team, approval: str = "{mode: bypass}") -> str:
    """An agent whose one call is a non-replayable effect."""
    return agent(team.workspace, f"model: script\ntools: [test.effect]\napproval: {approval}\nscript:\n{EFFECT_CALL}")


def delegating(team: Team, tool: str, child: str) -> str:
    args = {
        "oz.delegate": f"{{agent: {child}, input: go}}",
        "oz.ask_agent": f"{{agent: {child}, question: go}}",
        "oz.quarantine": f"{{agent: {child}, input: go, output_schema: {{type: integer}}}}",
        "oz.flow": f"{{flow: {child}, input: go}}",
    }[tool]
    return agent(
        team.workspace,
        f"model: script\ntools: [{tool}]\napproval: {{mode: bypass}}\nscript:\n"
        f"  - tool_calls: [{{tool: {tool}, args: {args}}}]\n  - text: went on\n",
        prefix="boss",
    )


def the_call(child: Run) -> Task:
    return Task.objects.get(run=child, key="r1.1")


def parked(run: Run, key: str) -> dict[str, Any]:
    event = TraceEvent.objects.filter(run=run, task_key=key, event="status", to_status="needs_approval").first()
    assert event is not None, f"{key} never waited for a person"
    return dict(event.data or {})


@pytest.mark.spec("S5", "F14", "F15")
@pytest.mark.parametrize("tool", ["oz.delegate", "oz.ask_agent", "oz.quarantine"])
def test_a_child_declared_bypass_of_a_parent_in_ask_waits_for_a_person(
    team: Team, django_capture_on_commit_callbacks: Any, tool: str
) -> None:
    parent = create(
        team.workspace, team.users["operator"], agent=delegating(team, tool, acting_child(team)), approval={"mode": "ask"}
    )
    parent = drive_tree(parent, django_capture_on_commit_callbacks)
    child = child_of(parent, "r1.1")
    call = the_call(child)
    # The non-replayable call did not run with nobody asked: it waits in the inbox.
    assert call.status == "needs_approval"
    assert not TraceEvent.objects.filter(run=child, task_key="r1.1", event="approval_granted").exists()
    assert parked(child, "r1.1") == {"by": "ask", "mode_of": "parent", "run": str(parent.pk), "agent": parent.agent_name}
    _, inbox = team.api("operator").get(f"/inbox?workspace={team.slug}&kind=approval")
    assert [(i["run"], i["task"]) for i in inbox["items"]] == [(str(child.pk), "r1.1")]


@pytest.mark.spec("S5", "F17")
def test_a_flow_step_runs_under_the_flows_mode_and_a_flow_adds_none_of_its_own(
    team: Team, django_capture_on_commit_callbacks: Any
) -> None:
    flow = agent(team.workspace, f"kind: flow\nsteps:\n  - id: act\n    agent: {acting_child(team)}\n", prefix="flow")
    asked = drive_tree(
        create(team.workspace, team.users["operator"], agent=flow, approval={"mode": "ask"}), django_capture_on_commit_callbacks
    )
    assert the_call(child_of(asked, "act")).status == "needs_approval"
    assert parked(child_of(asked, "act"), "r1.1")["mode_of"] == "parent"
    # A flow started without an `approval` adds no mode of its own: its steps run under their agents'.
    run, _ = kernel.create_run(workspace=team.workspace, user=team.users["operator"], body={"agent": flow})
    run = drive_tree(run, django_capture_on_commit_callbacks)
    assert the_call(child_of(run, "act")).status == "completed"
    # A flow started by a parent in ask: the parent's mode reaches the step through the flow.
    boss = delegating(team, "oz.flow", flow)
    parent = create(team.workspace, team.users["operator"], agent=boss, approval={"mode": "ask"})
    parent = drive_tree(parent, django_capture_on_commit_callbacks)
    step_child = child_of(child_of(parent, "r1.1"), "act")
    assert the_call(step_child).status == "needs_approval"
    assert parked(step_child, "r1.1")["mode_of"] == "ancestor" and parked(step_child, "r1.1")["run"] == str(parent.pk)


@pytest.mark.spec("S5", "F14")
def test_a_grandchild_stays_under_its_grandparents_mode(team: Team, django_capture_on_commit_callbacks: Any) -> None:
    middle = delegating(team, "oz.delegate", acting_child(team))
    root = create(team.workspace, team.users["operator"], agent=delegating(team, "oz.delegate", middle), approval={"mode": "ask"})
    root = drive_tree(root, django_capture_on_commit_callbacks)
    grandchild = child_of(child_of(root, "r1.1"), "r1.1")
    assert the_call(grandchild).status == "needs_approval"
    assert parked(grandchild, "r1.1")["mode_of"] == "ancestor"


@pytest.mark.spec("S5", "F14")
def test_a_parents_rule_denies_a_childs_call_and_the_trace_names_the_parents_rule(
    team: Team, django_capture_on_commit_callbacks: Any
) -> None:
    parent = create(
        team.workspace,
        team.users["operator"],
        agent=delegating(team, "oz.delegate", acting_child(team)),
        approval={"mode": "rules", "rules": [{"tool": "test.effect", "decision": "deny", "name": "no effects below"}]},
    )
    parent = drive_tree(parent, django_capture_on_commit_callbacks)
    child = child_of(parent, "r1.1")
    call = the_call(child)
    assert (call.status, call.error_key) == ("failed", "approval_denied")
    denied = TraceEvent.objects.get(run=child, task_key="r1.1", event="approval_denied")
    assert denied.data["rule"] == "no effects below" and denied.data["mode_of"] == "parent"
    assert denied.data["run"] == str(parent.pk)


@pytest.mark.spec("S5", "F14")
def test_a_child_stricter_than_its_parent_keeps_its_own_mode(team: Team, django_capture_on_commit_callbacks: Any) -> None:
    parent = create(team.workspace, team.users["operator"], agent=delegating(team, "oz.delegate", acting_child(team, "ask")))
    parent = drive_tree(parent, django_capture_on_commit_callbacks)
    child = child_of(parent, "r1.1")
    assert the_call(child).status == "needs_approval"
    assert parked(child, "r1.1") == {"by": "ask", "mode_of": "own"}


@pytest.mark.spec("S5")
def test_the_stricter_decision_wins_call_by_call() -> None:
    allow_echo = {"tool": "test.echo", "decision": "allow", "name": "echo ok"}
    deny_effect = {"tool": "test.effect", "decision": "deny", "name": "no effects"}

    def decide(own: dict[str, Any], *parents: dict[str, Any], tool: str = "test.echo") -> tuple[Any, Any, Any]:
        inherited = [{"run": f"p{i}", "agent": f"a{i}", **p} for i, p in enumerate(parents)]
        decision, who = call_decision({**own, "inherited": inherited}, tool, {})
        return decision, who["by"], who.get("mode_of")

    bypass, ask = {"mode": "bypass"}, {"mode": "ask"}
    rules = {"mode": "rules", "rules": [allow_echo, deny_effect]}
    # A top-level run: its own mode alone, and the trace says nothing of whose.
    assert call_decision(bypass, "test.echo", {}) == ("allow", {"by": "bypass"})
    assert decide(bypass, bypass) == ("allow", "bypass", "own")
    assert decide(bypass, ask) == (None, "ask", "parent")
    assert decide(ask, bypass) == (None, "ask", "own")
    # rules with ask: a person decides what a rule allows, and what a rule denies stays denied.
    assert decide(rules, ask) == (None, "ask", "parent")
    assert decide(rules, ask, tool="test.effect") == ("deny", "rules", "own")
    assert decide(ask, rules, tool="test.effect") == ("deny", "rules", "parent")
    assert decide(bypass, rules) == ("allow", "bypass", "own")
    assert decide(bypass, rules, tool="test.clock") == (None, "rules", "parent")
    assert decide(bypass, bypass, ask) == (None, "ask", "ancestor")
