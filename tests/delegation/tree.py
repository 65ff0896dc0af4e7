"""Drive a tree of runs (a parent and its children) in-process, and read what the parent's model
was sent. Cross-run messages (a child's end, a parent's cancel) are delivered after commit, as in
a worker, by executing the on-commit callbacks the kernel registered; `deliver=False` leaves them
lost, for the sweep to find."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from oz0agents.registry import register
from runs import kernel
from runs.models import Run, Task, TraceEvent
from tenancy.models import Workspace
from tests.factories import unique
from tests.runs.driver import drive, queued


def agent(workspace: Workspace, manifest: str, *, prefix: str = "agent") -> str:
    """Register a script agent; `manifest` holds everything but its name. Returns the name."""
    name = unique(prefix)
    if "instructions:" not in manifest and "kind: flow" not in manifest:
        manifest = f"instructions: Do the work you are given.\n{manifest}"
    register(f"name: {name}\n{manifest}", workspace=workspace)
    return name


def tree(root: Run) -> list[Run]:
    """The root and every descendant run, parents first."""
    runs, frontier = [root], [root]
    while frontier:
        frontier = list(Run.objects.filter(parent__in=frontier).order_by("created_at"))
        runs.extend(frontier)
    return runs


@contextmanager
def delivering(capture: Any, deliver: bool) -> Iterator[None]:
    if deliver:
        with capture(execute=True):
            yield
    else:
        yield


def drive_tree(root: Run, capture: Any, *, deliver: bool = True, rounds: int = 30) -> Run:
    """Run every queued task of every run in the tree until nothing moves."""
    for _ in range(rounds):
        moved = False
        for run in tree(root):
            if queued(run):
                with delivering(capture, deliver):
                    drive(run)
                moved = True
        if not moved:
            break
    root.refresh_from_db()
    return root


def requests(run: Run) -> list[list[dict[str, Any]]]:
    """The messages of each provider call of the run's rounds, each request whole."""
    whole: list[dict[str, Any]] = []
    out = []
    for event in TraceEvent.objects.filter(run=run, event="provider_call").order_by("seq"):
        request = event.data["request"]
        whole = whole[: request["messages_from"]] + list(request["messages"])
        out.append(list(whole))
    return out


def tool_answer(messages: list[dict[str, Any]], tool: str) -> dict[str, Any]:
    """The last answer of `tool` in a request, its content parsed when it is a JSON label."""
    found = [m for m in messages if m.get("role") == "tool" and m.get("tool") == tool]
    assert found, f"no answer of {tool} in {messages}"
    message = found[-1]
    try:
        return {**message, "label": json.loads(message["content"])}
    except (TypeError, ValueError):
        return {**message, "label": None}


def child_of(run: Run, key: str) -> Run:
    task = Task.objects.get(run=run, key=key)
    assert task.child_id is not None
    return Run.objects.get(pk=task.child_id)


def create(workspace: Workspace, user: Any, **body: Any) -> Run:
    run, _ = kernel.create_run(workspace=workspace, user=user, body={"approval": {"mode": "bypass"}, **body})
    return run
