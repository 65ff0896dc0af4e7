"""Runs in the states the console shows, driven through the kernel in-process (no worker):
the tests play the worker's part with claim_task / round_expand / task_fail, each report keyed by its Claimed."""

from __future__ import annotations

from typing import Any

from oz0agents.models import Agent, AgentVersion
from runs import kernel
from runs.models import Run, Task
from tenancy.models import Workspace


def agent(name: str, workspace: Workspace, version: int = 1) -> str:
    """The workspace's agent row (and a version) so its runs carry an agent's name."""
    row, _ = Agent.objects.get_or_create(name=name, workspace=workspace)
    AgentVersion.objects.get_or_create(
        agent=row, version=version, defaults={"manifest_text": "", "manifest": {"name": name}, "digest": f"{name}-{version}"}
    )
    return name


def task(run: Run, key: str) -> Task:
    return Task.objects.get(run=run, key=key)


def approval_run(
    workspace: Workspace,
    user: Any,
    *,
    args: Any = None,
    tool: str = "test.echo",
    agent_name: str | None = None,
    private: bool = False,
) -> Run:
    """A run whose model asked for one tool call that now waits in needs_approval as `r1.1`."""
    body: dict[str, Any] = {
        "tasks": [{"key": "r1", "kind": "round", "model": "script", "prompt": "go", "script": [{"text": "done"}], "after": []}],
        "deliverable": "r1",
        "approval": {"mode": "ask"},
        "private": private,
    }
    if agent_name:
        body["agent"] = agent_name
    run, _ = kernel.create_run(workspace=workspace, user=user, body=body)
    r1 = task(run, "r1")
    claimed = kernel.claim_task(None, r1.pk, "test-claim")
    assert claimed is not None
    calls = [{"tool": tool, "args": args if args is not None else {"value": 1}}]
    assert kernel.round_expand(claimed, calls, extra={}, state={}, allowed_tools=None, tool_policies={})
    assert task(run, "r1.1").status == "needs_approval"
    return Run.objects.get(pk=run.pk)


def question_run(workspace: Workspace, user: Any, *, question: str = "Which region?") -> Run:
    run, _ = kernel.create_run(
        workspace=workspace,
        user=user,
        body={
            "tasks": [{"key": "r1", "kind": "round", "model": "script", "prompt": "go", "script": [{"text": "ok"}], "after": []}]
        },
    )
    r1 = task(run, "r1")
    claimed = kernel.claim_task(None, r1.pk, "test-claim")
    assert claimed is not None
    assert kernel.round_ask(claimed, question, extra={}, state={})
    return Run.objects.get(pk=run.pk)


def halted_run(workspace: Workspace, user: Any, *, detail: str = "boom: secret words", agent_name: str | None = None) -> Run:
    """A run held on `a` (a halt failure), with `c` waiting after it and `d` done."""
    body: dict[str, Any] = {
        "tasks": [
            {
                "key": "a",
                "kind": "tool",
                "tool": "test.fail",
                "args": {"error": "tool_failed", "detail": detail},
                "after": [],
                "on_failure": "halt",
            },
            {"key": "c", "kind": "tool", "tool": "test.echo", "args": {"value": 1}, "after": ["a"]},
        ],
        "deliverable": "c",
    }
    if agent_name:
        body["agent"] = agent_name
    run, _ = kernel.create_run(workspace=workspace, user=user, body=body)
    a = task(run, "a")
    claimed = kernel.claim_task(None, a.pk, "test-claim")
    assert claimed is not None
    assert kernel.task_fail(claimed, "tool_failed", detail)
    run = Run.objects.get(pk=run.pk)
    assert run.status == "needs_attention", run.status
    return run
