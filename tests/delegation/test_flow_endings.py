"""A flow ends as it really ended (F1, F5, F10, F17, F18): a step's failure that no later step
reads (a `when:` guard or an input template on its `failure` or `status`) fails the flow with that
step's failure; the flow ends only when every step has settled and never cancels a step as a join
loser; its output is the steps its manifest names under `output:`, else its last step that
completed; a step naming no agent is refused at registration and fails `unavailable` at run time."""

from __future__ import annotations

from typing import Any

import pytest

from oz0agents.models import Agent, AgentVersion
from runs import kernel
from runs.models import Finding, Run, Task
from tests.conftest import Team
from tests.delegation.test_flows import fetcher, saying
from tests.delegation.tree import agent, child_of, create, drive_tree

pytestmark = pytest.mark.usefixtures("no_dispatch")


def flow(team: Team, steps: str, *, extra: str = "") -> str:
    return agent(team.workspace, f"kind: flow\n{extra}steps:\n{steps}", prefix="flow")


def run_flow(team: Team, name: str, capture: Any) -> Run:
    return drive_tree(create(team.workspace, team.users["operator"], agent=name), capture)


def steps_of(run: Run) -> dict[str, Task]:
    return {t.key: t for t in Task.objects.filter(run=run)}


@pytest.mark.spec("F17", "F1", "F10", "F18")
def test_a_failed_middle_step_no_later_step_reads_fails_the_flow_with_its_failure(
    team: Team, django_capture_on_commit_callbacks: Any
) -> None:
    fetch = fetcher(team, fails=True)
    name = flow(
        team,
        f"  - id: fetch\n    agent: {fetch}\n  - id: report\n    agent: {saying(team, 'reported')}\n    after: [fetch]\n",
    )
    run = run_flow(team, name, django_capture_on_commit_callbacks)
    steps = steps_of(run)
    job = child_of(run, "fetch")
    assert run.status == "canceled" and run.output is None
    assert run.failure == {
        "kind": "no_invoice",
        "retryable": False,
        "partial": False,
        "person": True,
        "declared": True,
        "message": "nothing under that number",
        "words_of": f"the agent {fetch} (job {job.pk})",
    }
    # Nothing after the failed step ran on its missing output.
    assert steps["report"].status == "skipped" and steps["report"].child_id is None
    # The scorecard counts a failure of the step's kind, not a success.
    assert Finding.objects.get(run_id=run.pk).kind == "no_invoice"
    # The API says whose words the message is; a viewer gets the kind and flags, no words.
    _, document = team.api("reader").get(f"/runs/{run.pk}")
    assert document["failure"]["words_of"] == f"the agent {fetch} (job {job.pk})"
    assert document["failure"]["message"] == "nothing under that number"
    _, as_viewer = team.api("viewer").get(f"/runs/{run.pk}")
    assert as_viewer["failure"]["kind"] == "no_invoice" and as_viewer["failure"]["message"] is None


@pytest.mark.spec("F17")
def test_parallel_final_steps_all_run_and_none_is_canceled_as_a_loser(
    team: Team, django_capture_on_commit_callbacks: Any
) -> None:
    name = flow(
        team,
        f"  - id: left\n    agent: {saying(team, 'left done')}\n  - id: right\n    agent: {saying(team, 'right done')}\n",
    )
    run = run_flow(team, name, django_capture_on_commit_callbacks)
    steps = steps_of(run)
    assert (steps["left"].status, steps["right"].status) == ("completed", "completed")
    assert not Task.objects.filter(run__parent=run, error_key="join_loser_canceled").exists()
    assert all(child.status == "completed" for child in Run.objects.filter(parent=run))
    # With no `output:`, the flow's output is its last step's.
    assert (run.status, run.output) == ("completed", "right done")


@pytest.mark.spec("F17")
def test_a_flows_output_is_the_steps_its_manifest_names(team: Team, django_capture_on_commit_callbacks: Any) -> None:
    steps = f"  - id: left\n    agent: {saying(team, 'L')}\n  - id: right\n    agent: {saying(team, 'R')}\n"
    one = run_flow(team, flow(team, steps, extra="output: left\n"), django_capture_on_commit_callbacks)
    assert (one.status, one.output) == ("completed", "L")
    both = run_flow(team, flow(team, steps, extra="output: [right, left]\n"), django_capture_on_commit_callbacks)
    assert (both.status, both.output) == ("completed", {"right": "R", "left": "L"})


@pytest.mark.spec("F17", "F1")
def test_a_flow_fails_only_once_every_step_has_settled(team: Team, django_capture_on_commit_callbacks: Any) -> None:
    asking = agent(
        team.workspace,
        "model: script\ntools: [test.echo]\napproval: {mode: ask}\nscript:\n"
        "  - tool_calls: [{tool: test.echo, args: {value: 1}}]\n  - text: slow done\n",
        prefix="slow",
    )
    name = flow(team, f"  - id: fetch\n    agent: {fetcher(team, fails=True)}\n  - id: slow\n    agent: {asking}\n")
    run = create(team.workspace, team.users["operator"], agent=name, approval={"mode": "ask"})
    run = drive_tree(run, django_capture_on_commit_callbacks)
    slow = child_of(run, "slow")
    # fetch failed while slow waits for a person: the flow waits for it, and cancels nothing.
    assert steps_of(run)["fetch"].status == "failed" and run.status == "running"
    assert slow.status == "running" and Task.objects.get(run=slow, key="r1.1").status == "needs_approval"
    with django_capture_on_commit_callbacks(execute=True):
        kernel.approve(run_id=slow.pk, key="r1.1", user=team.users["operator"])
    run = drive_tree(run, django_capture_on_commit_callbacks)
    assert Run.objects.get(pk=slow.pk).status == "completed"
    assert run.status == "canceled" and run.failure["kind"] == "no_invoice"


@pytest.mark.spec("F17")
def test_a_failure_read_by_a_later_step_is_handled_and_the_flow_completes(
    team: Team, django_capture_on_commit_callbacks: Any
) -> None:
    name = flow(
        team,
        f"  - id: fetch\n    agent: {fetcher(team, fails=True)}\n"
        f"  - id: report\n    agent: {saying(team, 'reported')}\n    after: [fetch]\n"
        "    when: steps.fetch.status == 'failed'\n",
    )
    run = run_flow(team, name, django_capture_on_commit_callbacks)
    assert (run.status, run.output) == ("completed", "reported")
    assert not Finding.objects.filter(run_id=run.pk).exists()


@pytest.mark.spec("F17", "F9")
def test_a_step_naming_an_agent_that_does_not_exist_is_refused_at_registration(team: Team) -> None:
    manifest = "name: lost-flow\nkind: flow\nsteps:\n  - id: one\n    agent: nobody-here\n"
    status, body = team.api().post("/agents", {"manifest": manifest, "workspace": team.slug})
    assert status == 400 and body["error"]["key"] == "invalid_manifest"
    assert [(e["line"], e["field"]) for e in body["error"]["errors"]] == [(5, "steps[0].agent")]
    assert "nobody-here" in body["error"]["errors"][0]["message"]
    status, linted = team.api().post("/agents/lint", {"manifest": manifest, "workspace": team.slug})
    assert status == 200 and [e["field"] for e in linted["errors"]] == ["steps[0].agent"]


@pytest.mark.spec("F17", "F9", "F1")
def test_a_step_whose_agent_is_gone_at_run_time_fails_the_flow_unavailable(
    team: Team, django_capture_on_commit_callbacks: Any
) -> None:
    # A flow stored before its step's agent could be checked (or whose agent is gone since).
    row = Agent.objects.create(name="stale-flow", workspace=team.workspace)
    manifest = {"name": "stale-flow", "kind": "flow", "steps": [{"id": "one", "agent": "nobody-here", "after": []}]}
    AgentVersion.objects.create(agent=row, version=1, manifest_text="", manifest={**manifest, "failures": [], "tools": []})
    run = run_flow(team, "stale-flow", django_capture_on_commit_callbacks)
    assert run.status == "canceled" and run.output is None
    assert (run.failure["kind"], run.failure["declared"], run.failure["words_of"]) == ("unavailable", False, "oz0")
    assert steps_of(run)["one"].error_key == "agent_unavailable"


@pytest.mark.spec("F17")
def test_flow_lint_names_a_bad_output_with_its_line(team: Team) -> None:
    head = "name: out-flow\nkind: flow\nsteps:\n  - id: one\n    agent: a\n"
    for output, why in (("nowhere", "not a step"), ("[one, one]", "twice"), ("{a: 1}", "list of step ids"), ("[]", "list")):
        status, body = team.api().post("/agents/lint", {"manifest": f"{head}output: {output}\n"})
        assert status == 200
        assert [(e["line"], e["field"]) for e in body["errors"]] == [(6, "output")], body
        assert why in body["errors"][0]["message"]
    status, body = team.api().post("/agents/lint", {"manifest": f"{head}output: one\n"})
    assert status == 200 and body["errors"] == []
