"""Delegation through the JSON API on a real Celery worker and beat: a failed child read by the
parent's model as its tool's answer, and a parent's cancel stopping a sleeping child (F14, F16)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import Team, wait_for
from tests.factories import unique

pytestmark = pytest.mark.live

WORDS = "no such invoice in the ledger"


def register(team: Team, manifest: str, prefix: str) -> str:
    name = unique(prefix)
    status, body = team.api().post(
        "/agents", {"manifest": f"name: {name}\ninstructions: Do the work.\n{manifest}", "workspace": team.slug}
    )
    assert status == 201, body
    return name


def settled(team: Team, run_id: str, statuses: tuple[str, ...]) -> dict[str, Any]:
    def done() -> Any:
        status, body = team.api().get(f"/runs/{run_id}")
        return body if status == 200 and body["status"] in statuses else None

    return wait_for(done, timeout=60, message=f"run {run_id} to be {statuses}")


@pytest.mark.spec("F14", "F12")
def test_a_failed_child_is_the_parents_tool_answer_on_a_real_worker(live_team: Team) -> None:
    team = live_team
    helper = register(
        team,
        "model: script\ntools: [oz.fail]\nfailures:\n  - kind: no_invoice\n    description: No invoice\n"
        f"approval: {{mode: bypass}}\nscript:\n  - oz_fail: {{kind: no_invoice, message: {WORDS!r}}}\n",
        "helper",
    )
    boss = register(
        team,
        f"model: script\ntools: [oz.delegate]\napproval: {{mode: bypass}}\nscript:\n"
        f"  - tool_calls: [{{tool: oz.delegate, args: {{agent: {helper}}}}}]\n  - text: went on\n",
        "boss",
    )
    status, created = team.api().post(f"/workspaces/{team.slug}/runs", {"agent": boss})
    assert status == 201, created
    parent = settled(team, created["run"]["id"], ("completed", "canceled", "needs_attention"))
    assert parent["status"] == "completed" and parent["output"] == "went on"
    [child] = parent["children"]
    assert child["status"] == "canceled" and child["failure"]["kind"] == "no_invoice"
    assert child["failure"]["message"] is None  # the children list never carries a child's words
    status, trace = team.api().get(f"/runs/{parent['id']}/trace")
    events = trace["events"] if isinstance(trace, dict) else trace
    calls = [e for e in events if e["event"] == "provider_call"]
    answer = next(m for m in calls[1]["data"]["request"]["messages"] if m.get("role") == "tool")
    label = json.loads(answer["content"])
    assert label["failed"] is True and label["kind"] == "no_invoice" and label["message"] == WORDS
    assert label["words_of"] == f"the agent {helper} (job {child['id']})"
    ended = next(e for e in events if e["event"] == "child_ended")
    assert WORDS not in json.dumps(ended)


@pytest.mark.spec("F16")
def test_a_parent_cancel_stops_a_sleeping_child_on_a_real_worker(live_team: Team) -> None:
    team = live_team
    sleeper = register(
        team,
        "model: script\ntools: [test.sleep]\napproval: {mode: bypass}\nscript:\n"
        "  - tool_calls: [{tool: test.sleep, args: {seconds: 40}}]\n  - text: slept\n",
        "sleeper",
    )
    status, created = team.api().post(
        # The child runs under the stricter of its parent's mode and its own: the parent says bypass.
        f"/workspaces/{team.slug}/runs",
        {"tasks": [{"key": "d", "kind": "delegate", "agent": sleeper}], "approval": {"mode": "bypass"}},
    )
    assert status == 201, created
    parent_id = created["run"]["id"]
    child_id = created["run"]["children"][0]["id"]

    def sleeping() -> Any:
        _, child = team.api().get(f"/runs/{child_id}")
        return any(t["key"] == "r1.1" and t["status"] == "running" for t in child["tasks"])

    wait_for(sleeping, timeout=30, message="the child's sleep to be running")
    status, _ = team.api().post(f"/runs/{parent_id}/cancel", {"reason": "enough"})
    assert status == 200
    parent = settled(team, parent_id, ("canceled",))
    _, child = team.api().get(f"/runs/{child_id}")
    assert child["status"] == "canceled"
    assert parent["failure"]["kind"] == "cancelled" and parent["failure"]["message"] == "enough"
    assert next(t for t in parent["tasks"] if t["key"] == "d")["status"] == "canceled"


@pytest.mark.spec("F15", "F17", "F5")
def test_a_flow_with_an_error_branch_a_template_and_a_quarantine_on_a_real_worker(live_team: Team) -> None:
    """Through the API on the real worker: the failing step's error branch runs with the failure's
    kind written into its input (no taint), the success branch is skipped, and a quarantine gives
    the parent a schema-checked value."""
    team = live_team
    fetch = register(
        team,
        "model: script\ntools: [oz.fail]\nfailures:\n  - kind: no_invoice\n    description: No invoice\n"
        f"approval: {{mode: bypass}}\nscript:\n  - oz_fail: {{kind: no_invoice, message: {WORDS!r}}}\n",
        "fetch",
    )
    report = register(team, "model: script\napproval: {mode: bypass}\nscript:\n  - text: '{\"score\": 3}'\n", "report")
    summarize = register(team, "model: script\napproval: {mode: bypass}\nscript:\n  - text: summarized\n", "summarize")
    flow = unique("flow")
    manifest = (
        f"name: {flow}\nkind: flow\nsteps:\n"
        f"  - id: fetch\n    agent: {fetch}\n"
        f"  - id: report\n    agent: {report}\n    after: [fetch]\n"
        "    when: \"steps.fetch.failure.kind == 'no_invoice'\"\n"
        "    input: {why: '{{ steps.fetch.failure.kind }}', customer: '{{ input.customer }}'}\n"
        f"  - id: summarize\n    agent: {summarize}\n    after: [fetch]\n    when: steps.fetch.failure == null\n"
    )
    status, body = team.api().post("/agents", {"manifest": manifest, "workspace": team.slug})
    assert status == 201, body
    status, created = team.api().post(f"/workspaces/{team.slug}/runs", {"agent": flow, "input": {"customer": "acme"}})
    assert status == 201, created
    done = settled(team, created["run"]["id"], ("completed", "canceled", "needs_attention"))
    assert done["status"] == "completed" and done["tainted"] is False, done
    steps = {t["key"]: t for t in done["tasks"]}
    assert steps["fetch"]["status"] == "failed" and steps["fetch"]["failure"]["kind"] == "no_invoice"
    assert steps["summarize"]["status"] == "skipped" and steps["report"]["status"] == "completed"
    report_child = next(c for c in done["children"] if c["task"] == "report")
    _, child = team.api().get(f"/runs/{report_child['id']}")
    assert child["input"] == {"why": "no_invoice", "customer": "acme"} and child["tainted"] is False

    schema = {"type": "object", "properties": {"score": {"type": "integer"}}, "required": ["score"]}
    status, created = team.api().post(
        f"/workspaces/{team.slug}/runs",
        {"tasks": [{"key": "q", "kind": "delegate", "agent": report, "via": "quarantine", "output_schema": schema}]},
    )
    assert status == 201, created
    done = settled(team, created["run"]["id"], ("completed", "canceled", "needs_attention"))
    assert done["status"] == "completed" and done["output"] == {"score": 3}, done
