"""Pause and resume reach a run's children (F16's sibling): pausing a parent pauses the job tree
whole, resuming it resumes what its pause paused, never a child a person paused on their own, and
the delegation sweep delivers a pause or resume a crash lost."""

from __future__ import annotations

from typing import Any

import pytest

from runs import kernel
from runs.models import Run, TraceEvent
from tests.conftest import Team
from tests.delegation.tree import agent, create

pytestmark = pytest.mark.usefixtures("no_dispatch")


def _tree(team: Team, capture: Any) -> tuple[Run, Run, Run]:
    """A parent, its child and the child's child, each waiting on work nobody runs yet."""
    leaf = agent(team.workspace, "model: script\napproval: {mode: bypass}\nscript:\n  - text: leaf\n", prefix="leaf")
    middle = agent(team.workspace, f"kind: flow\nsteps:\n  - id: only\n    agent: {leaf}\n", prefix="middle")
    with capture(execute=True):
        parent = create(team.workspace, team.users["operator"], tasks=[{"key": "d", "kind": "delegate", "agent": middle}])
    child = Run.objects.get(parent=parent)
    grandchild = Run.objects.get(parent=child)
    return parent, child, grandchild


def _status(*runs: Run) -> list[str]:
    return [Run.objects.get(pk=run.pk).status for run in runs]


@pytest.mark.spec("F16")
def test_pausing_a_parent_pauses_its_tree_and_resuming_it_resumes_what_it_paused(
    team: Team, django_capture_on_commit_callbacks: Any
) -> None:
    parent, child, grandchild = _tree(team, django_capture_on_commit_callbacks)
    assert _status(child, grandchild) == ["running", "running"]
    operator = team.users["operator"]
    with django_capture_on_commit_callbacks(execute=True):
        kernel.pause_run(run_id=parent.pk, user=operator)
    assert _status(parent, child, grandchild) == ["paused", "paused", "paused"]
    pause = TraceEvent.objects.get(run=child, event="verb", data__verb="pause")
    assert pause.data == {"verb": "pause", "by": "parent"} and pause.actor == "parent"
    with django_capture_on_commit_callbacks(execute=True):
        kernel.resume_run(run_id=parent.pk, user=operator)
    assert _status(parent, child, grandchild) == ["running", "running", "running"]


@pytest.mark.spec("F16")
def test_a_child_a_person_paused_stays_paused_when_the_parent_resumes(
    team: Team, django_capture_on_commit_callbacks: Any
) -> None:
    parent, child, grandchild = _tree(team, django_capture_on_commit_callbacks)
    operator = team.users["operator"]
    with django_capture_on_commit_callbacks(execute=True):
        kernel.pause_run(run_id=child.pk, user=operator)  # the person's own pause: the grandchild follows
        kernel.pause_run(run_id=parent.pk, user=operator)
    assert _status(parent, child, grandchild) == ["paused", "paused", "paused"]
    with django_capture_on_commit_callbacks(execute=True):
        kernel.resume_run(run_id=parent.pk, user=operator)
    assert _status(parent, child, grandchild) == ["running", "paused", "paused"]
    # Nor does the sweep resume it: the child's pause was a person's.
    kernel.sweep_delegations()
    assert _status(child, grandchild) == ["paused", "paused"]
    with django_capture_on_commit_callbacks(execute=True):
        kernel.resume_run(run_id=child.pk, user=operator)
    assert _status(child, grandchild) == ["running", "running"]


@pytest.mark.spec("F16")
def test_the_sweep_delivers_a_lost_pause_and_a_lost_resume(team: Team, django_capture_on_commit_callbacks: Any) -> None:
    parent, child, grandchild = _tree(team, django_capture_on_commit_callbacks)
    operator = team.users["operator"]
    kernel.pause_run(run_id=parent.pk, user=operator)  # its after-commit messages never run: lost
    assert _status(parent, child) == ["paused", "running"]
    with django_capture_on_commit_callbacks(execute=True):
        kernel.sweep_delegations()
    assert _status(child, grandchild) == ["paused", "paused"]
    kernel.resume_run(run_id=parent.pk, user=operator)  # lost again
    assert _status(parent, child) == ["running", "paused"]
    with django_capture_on_commit_callbacks(execute=True):
        kernel.sweep_delegations()
    assert _status(child, grandchild) == ["running", "running"]


@pytest.mark.spec("F16")
def test_a_canceled_paused_parent_still_cancels_its_paused_children(team: Team, django_capture_on_commit_callbacks: Any) -> None:
    parent, child, grandchild = _tree(team, django_capture_on_commit_callbacks)
    operator = team.users["operator"]
    with django_capture_on_commit_callbacks(execute=True):
        kernel.pause_run(run_id=parent.pk, user=operator)
    with django_capture_on_commit_callbacks(execute=True):
        kernel.cancel_run(run_id=parent.pk, user=operator, reason="enough")
    assert _status(child, grandchild) == ["canceled", "canceled"]
    assert Run.objects.get(pk=parent.pk).status in ("canceling", "canceled")
