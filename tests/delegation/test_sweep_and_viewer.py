"""What crosses between two runs after commit is recovered by the delegation sweep when a crash
loses it (a child's settle, a parent's cancel), and a viewer sees a child's kinds, never its words
(F12, F14, F16)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runs import kernel
from runs.models import Task
from tests.conftest import Team
from tests.delegation.tree import agent, child_of, create, drive_tree
from tests.runs.driver import step, task

pytestmark = pytest.mark.usefixtures("no_dispatch")

WORDS = "the secret reason the helper gave up"


@pytest.mark.spec("F14")
def test_a_lost_settle_is_recovered_by_the_sweep(team: Team) -> None:
    helper = agent(team.workspace, "model: script\napproval: {mode: bypass}\nscript:\n  - text: done below\n")
    parent = create(team.workspace, team.users["operator"], tasks=[{"key": "d", "kind": "delegate", "agent": helper}])
    # No after-commit delivery: the child's end never reaches its parent.
    parent = drive_tree(parent, None, deliver=False)
    child = child_of(parent, "d")
    assert child.status == "completed"
    assert (parent.status, task(parent, "d").status) == ("running", "running")

    assert kernel.sweep_delegations() >= 1
    parent.refresh_from_db()
    assert (parent.status, parent.output) == ("completed", "done below")
    # Idempotent: a second settle (a late message, another sweep) changes nothing.
    assert kernel.settle_parent(str(child.pk)) is False
    kernel.sweep_delegations()
    assert Task.objects.get(run=parent, key="d").status == "completed"


@pytest.mark.spec("F16")
def test_a_lost_cancel_is_recovered_by_the_sweep(team: Team) -> None:
    sleeper = agent(
        team.workspace,
        "model: script\ntools: [test.sleep]\napproval: {mode: bypass}\nscript:\n"
        "  - tool_calls: [{tool: test.sleep, args: {seconds: 30}}]\n  - text: slept\n",
    )
    parent = create(team.workspace, team.users["operator"], tasks=[{"key": "d", "kind": "delegate", "agent": sleeper}])
    child = child_of(parent, "d")
    step(child, task(child, "r1"))
    kernel.cancel_run(run_id=parent.pk, user=team.users["operator"], reason="stop")
    child.refresh_from_db()
    parent.refresh_from_db()
    assert (parent.status, child.status) == ("canceling", "running")  # the cancel_child message was lost
    kernel.sweep_delegations()  # cancels the child; its settle is lost again (no after-commit here)
    kernel.sweep_delegations()  # settles the parent
    child.refresh_from_db()
    parent.refresh_from_db()
    assert (parent.status, child.status) == ("canceled", "canceled")
    assert task(parent, "d").status == "canceled"


@pytest.mark.spec("F12", "F11")
def test_a_viewer_sees_a_childs_kinds_without_its_words(team: Team, django_capture_on_commit_callbacks: Any) -> None:
    helper = agent(
        team.workspace,
        "model: script\ntools: [oz.fail]\nfailures:\n  - kind: gave_up\n    description: Gave up\n"
        f"approval: {{mode: bypass}}\nscript:\n  - oz_fail: {{kind: gave_up, message: {WORDS!r}}}\n",
    )
    parent = create(
        team.workspace, team.users["operator"], tasks=[{"key": "d", "kind": "delegate", "agent": helper, "on_failure": "halt"}]
    )
    parent = drive_tree(parent, django_capture_on_commit_callbacks)
    child = child_of(parent, "d")
    assert parent.status == "needs_attention"

    status, document = team.api("viewer").get(f"/runs/{parent.pk}")
    assert status == 200
    assert document["children"] == [
        {
            "id": str(child.pk),
            "task": "d",
            "agent": helper,
            "status": "canceled",
            "depth": 1,
            "failure": {
                "kind": "gave_up",
                "retryable": False,
                "partial": False,
                "person": False,
                "message": None,
                "declared": True,
            },
        }
    ]
    d = next(t for t in document["tasks"] if t["key"] == "d")
    assert d["failure"]["kind"] == "gave_up" and d["failure"]["message"] is None
    assert d["result"]["child"] == str(child.pk) and d["kind"] == "delegate"
    assert document["failure"]["kind"] == "gave_up" and document["failure"]["message"] is None
    status, trace = team.api("viewer").get(f"/runs/{parent.pk}/trace")
    assert status == 200
    ended = next(e for e in (trace["events"] if isinstance(trace, dict) else trace) if e["event"] == "child_ended")
    assert ended["data"]["kind"] == "gave_up" and ended["data"]["status"] == "canceled"
    status, child_document = team.api("viewer").get(f"/runs/{child.pk}")
    assert status == 200 and child_document["parent"] == str(parent.pk) and child_document["parent_task"] == "d"
    for body in (document, trace, child_document):
        assert WORDS not in json.dumps(body)
    # A reader of the content sees the words on the parent's task, labelled as the child's failure.
    status, read = team.api("reader").get(f"/runs/{parent.pk}")
    assert next(t for t in read["tasks"] if t["key"] == "d")["failure"]["message"] == WORDS
    assert Task.objects.get(run=parent, key="d").error_key == "child_failed"
