"""Delegate tasks: a child run per task, recorded on both sides, and a failed child read by the
parent's model as the tool's answer (F14, F12, F1)."""

from __future__ import annotations

from typing import Any

import pytest

from runs.models import Run, Task, TraceEvent
from tests.conftest import Team
from tests.delegation.tree import agent, child_of, create, drive_tree, requests, tool_answer

pytestmark = pytest.mark.usefixtures("no_dispatch")

CHILD_WORDS = "the helper could not find the invoice"


def failing_helper(team: Team, message: str = CHILD_WORDS) -> str:
    return agent(
        team.workspace,
        "model: script\ntools: [oz.fail]\nfailures:\n  - kind: no_invoice\n    description: No invoice\n    retryable: true\n"
        f"approval: {{mode: bypass}}\nscript:\n  - oz_fail: {{kind: no_invoice, message: {message!r}}}\n",
        prefix="helper",
    )


def answering_helper(team: Team, text: str = "42") -> str:
    return agent(team.workspace, f"model: script\napproval: {{mode: bypass}}\nscript:\n  - text: {text!r}\n", prefix="helper")


def boss(team: Team, tool: str, args: str) -> str:
    return agent(
        team.workspace,
        f"model: script\ntools: [{tool}]\napproval: {{mode: bypass}}\nscript:\n"
        f"  - tool_calls: [{{tool: {tool}, args: {args}}}]\n  - text: went on\n",
        prefix="boss",
    )


@pytest.mark.spec("F14", "F12")
def test_a_failed_child_is_the_delegate_tools_answer_and_the_parent_goes_on(
    team: Team, django_capture_on_commit_callbacks: Any
) -> None:
    helper = failing_helper(team)
    parent = create(
        team.workspace, team.users["operator"], agent=boss(team, "oz.delegate", f"{{agent: {helper}, input: {{n: 7}}}}")
    )
    parent = drive_tree(parent, django_capture_on_commit_callbacks)
    child = child_of(parent, "r1.1")

    assert parent.status == "completed" and parent.output == "went on"
    assert child.status == "canceled" and child.failure["kind"] == "no_invoice"
    # Recorded on both sides: the child knows its parent and task, the task its child; same creator.
    assert (child.parent_id, child.parent_task_key, child.depth) == (parent.pk, "r1.1", 1)
    assert child.created_by_id == parent.created_by_id and child.input == {"n": 7}
    delegate = Task.objects.get(run=parent, key="r1.1")
    assert (delegate.kind, delegate.status, delegate.error_key) == ("delegate", "failed", "child_failed")

    second = requests(parent)[1]
    answer = tool_answer(second, "oz.delegate")
    assert answer["ok"] is False
    assert answer["label"] == {
        "failed": True,
        "job": str(child.pk),
        "agent": helper,
        "kind": "no_invoice",
        "retryable": True,
        "partial": False,
        "person": False,
        "declared": True,
        "message": CHILD_WORDS,
        "words_of": f"the agent {helper} (job {child.pk})",
    }
    started = TraceEvent.objects.get(run=parent, event="child_started")
    ended = TraceEvent.objects.get(run=parent, event="child_ended")
    assert started.data["child"] == str(child.pk) and started.task_key == "r1.1"
    assert ended.data == {
        "child": str(child.pk),
        "agent": helper,
        "via": "delegate",
        "status": "canceled",
        "kind": "no_invoice",
        "retryable": True,
        "partial": False,
        "person": False,
        "declared": True,
        "decided": "failed",
    }
    assert CHILD_WORDS not in str(ended.data)
    created = TraceEvent.objects.get(run=child, event="run_created")
    assert created.data["parent"] == str(parent.pk) and created.data["parent_task"] == "r1.1"


@pytest.mark.spec("F14")
def test_a_failed_child_is_the_ask_agents_answer(team: Team, django_capture_on_commit_callbacks: Any) -> None:
    helper = failing_helper(team)
    parent = create(
        team.workspace,
        team.users["operator"],
        agent=boss(team, "oz.ask_agent", f"{{agent: {helper}, question: 'which invoice?'}}"),
    )
    parent = drive_tree(parent, django_capture_on_commit_callbacks)
    child = child_of(parent, "r1.1")
    assert child.input == {"question": "which invoice?"}
    assert parent.status == "completed"
    label = tool_answer(requests(parent)[1], "oz.ask_agent")["label"]
    assert label["failed"] is True and label["kind"] == "no_invoice" and label["message"] == CHILD_WORDS
    assert label["words_of"] == f"the agent {helper} (job {child.pk})"


@pytest.mark.spec("F14")
def test_a_childs_answer_is_the_tools_answer(team: Team, django_capture_on_commit_callbacks: Any) -> None:
    helper = answering_helper(team, "the invoice is 42")
    parent = create(team.workspace, team.users["operator"], agent=boss(team, "oz.delegate", f"{{agent: {helper}}}"))
    parent = drive_tree(parent, django_capture_on_commit_callbacks)
    assert parent.status == "completed"
    answer = tool_answer(requests(parent)[1], "oz.delegate")
    assert answer["ok"] is True and answer["content"] == "the invoice is 42"
    assert Task.objects.get(run=parent, key="r1.1").result["value"] == "the invoice is 42"


@pytest.mark.spec("F14", "F1")
def test_a_held_parent_carries_its_childs_kind(team: Team, django_capture_on_commit_callbacks: Any) -> None:
    helper = failing_helper(team)
    parent = create(
        team.workspace,
        team.users["operator"],
        tasks=[{"key": "d", "kind": "delegate", "agent": helper, "input": {"n": 1}, "on_failure": "halt"}],
    )
    parent = drive_tree(parent, django_capture_on_commit_callbacks)
    assert parent.status == "needs_attention"
    assert parent.failure["kind"] == "no_invoice" and parent.failure["declared"] is True
    assert parent.attention["blocked_task_keys"] == ["d"] and parent.attention["kinds"] == ["no_invoice"]


def test_a_delegate_task_naming_no_agent_fails_unavailable(team: Team, django_capture_on_commit_callbacks: Any) -> None:
    parent = create(team.workspace, team.users["operator"], tasks=[{"key": "d", "kind": "delegate", "agent": "nobody-here"}])
    parent = drive_tree(parent, django_capture_on_commit_callbacks)
    d = Task.objects.get(run=parent, key="d")
    assert (d.status, d.error_key, d.child_id) == ("failed", "agent_unavailable", None)
    assert not Run.objects.filter(parent=parent).exists()


@pytest.mark.spec("F1")
def test_the_tree_is_capped_in_depth_and_children(team: Team, settings: Any, django_capture_on_commit_callbacks: Any) -> None:
    helper = answering_helper(team)
    middle = agent(
        team.workspace,
        f"model: script\ntools: [oz.delegate]\napproval: {{mode: bypass}}\nscript:\n"
        f"  - tool_calls: [{{tool: oz.delegate, args: {{agent: {helper}}}}}]\n  - text: middle done\n",
    )
    settings.OZ0_TREE_MAX_DEPTH = 1
    parent = create(team.workspace, team.users["operator"], tasks=[{"key": "d", "kind": "delegate", "agent": middle}])
    parent = drive_tree(parent, django_capture_on_commit_callbacks)
    child = child_of(parent, "d")
    deep = Task.objects.get(run=child, key="r1.1")
    assert (deep.status, deep.error_key) == ("failed", "tree_too_deep")
    assert not Run.objects.filter(parent=child).exists()
    # The child read the refusal as its tool's answer (kind limit) and went on.
    assert tool_answer(requests(child)[1], "oz.delegate")["label"]["kind"] == "limit"

    settings.OZ0_TREE_MAX_DEPTH = 4
    settings.OZ0_TREE_MAX_CHILDREN = 1
    wide = create(
        team.workspace,
        team.users["operator"],
        tasks=[
            {"key": "a", "kind": "delegate", "agent": helper},
            {"key": "b", "kind": "delegate", "agent": helper, "on_failure": "absorb"},
        ],
        deliverable="a",
    )
    wide = drive_tree(wide, django_capture_on_commit_callbacks)
    assert Task.objects.get(run=wide, key="a").status == "completed"
    b = Task.objects.get(run=wide, key="b")
    assert (b.status, b.error_key) == ("failed", "too_many_children")
    assert Run.objects.filter(parent=wide).count() == 1


def test_bad_delegate_tasks_are_refused_typed_and_change_nothing(team: Team) -> None:
    before = Run.objects.count()
    for task, key in (
        ({"key": "d", "kind": "delegate", "agent": "x", "via": "quarantine"}, "missing_field"),
        ({"key": "d", "kind": "delegate", "agent": "x", "via": "quarantine", "output_schema": {"type": 12}}, "invalid_field"),
        ({"key": "d", "kind": "delegate", "agent": "x", "when": "__import__('os')"}, "invalid_field"),
        ({"key": "d", "kind": "delegate"}, "missing_field"),
    ):
        status, body = team.api().post(f"/workspaces/{team.slug}/runs", {"tasks": [task]})
        assert status == 400 and body["error"]["key"] == key, (task, body)
    assert Run.objects.count() == before
