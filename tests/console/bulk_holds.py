"""Held runs for the bulk-repair tests, driven through the kernel in-process (no worker): each
fails its halt task(s) with the error keys asked for, so kinds and error keys can be filtered."""

from __future__ import annotations

from typing import Any

from runs import kernel
from runs.models import Run, TraceEvent
from tenancy.models import Workspace
from tests.console import states


def held(
    workspace: Workspace,
    user: Any,
    *,
    errors: tuple[str, ...] = ("tool_failed",),
    agent: str | None = None,
    private: bool = False,
) -> Run:
    """A run held on its halt tasks t0, t1, … (one per error key), with `c` waiting after them."""
    keys = [f"t{i}" for i in range(len(errors))]
    tasks: list[dict[str, Any]] = [
        {"key": key, "kind": "tool", "tool": "test.fail", "args": {"error": error}, "after": [], "on_failure": "halt"}
        for key, error in zip(keys, errors, strict=True)
    ]
    tasks.append({"key": "c", "kind": "tool", "tool": "test.echo", "args": {"value": 1}, "after": keys})
    body: dict[str, Any] = {"tasks": tasks, "deliverable": "c"}
    if agent:
        body["agent"] = agent
    if private:
        body["private"] = True
    run, _ = kernel.create_run(workspace=workspace, user=user, body=body)
    for key, error in zip(keys, errors, strict=True):
        claimed = kernel.claim_task(None, states.task(run, key).pk, f"claim-{key}")
        assert claimed is not None
        assert kernel.task_fail(claimed, error, f"secret words of {key}")
    run = Run.objects.get(pk=run.pk)
    assert run.status == "needs_attention", run.status
    return run


def verb_events(run: Run, verb: str) -> dict[str, int]:
    """How many times each task of the run had the verb applied (the trace's `verb` events)."""
    counts: dict[str, int] = {}
    for event in TraceEvent.objects.filter(run=run, event="verb"):
        if (event.data or {}).get("verb") == verb:
            counts[event.task_key] = counts.get(event.task_key, 0) + 1
    return counts
