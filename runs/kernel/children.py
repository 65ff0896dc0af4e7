"""A ready delegate task's child run, opened (F14): the parent's side of a child's start.

`plan_child` decides whether the child may start: a step whose `when:` guard is false starts
nothing (F17); a tree too deep or too wide, an input whose templates cannot be filled, or an agent
the workspace cannot run is a refusal. Scheduling moves the task on that decision
(runs.kernel.scheduling.start_child). `open_child` writes the child's run row (a new row nobody
else can see yet, so no second run's lock is taken), with the parent's workspace, creator and
privacy, records `run_created` in the child's own `Txn` and `child_started` on the parent, and
leaves the child's tasks to the parent's commit (runs.kernel.commit adds them and commits the
child's transaction before the parent's trace is written).

A flow step's input may hold templates (`runs.kernel.templates`), filled in as its child starts.
Words of another agent that go in that way come without their labels: the flow is marked
`tainted`, and so is the child that reads them; a tainted run's children start tainted (F15).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from oz0agents.code_version import code_digest
from runs import failures
from runs.kernel.approvals import inherited_layers
from runs.kernel.compile import RunRequest, check_storable, compile_child
from runs.kernel.errors import InvalidRequest
from runs.kernel.graph import FAILED_STATUSES
from runs.kernel.guards import evaluate_guard, guard_steps, parse_guard
from runs.kernel.templates import TemplateError, has_templates, render, template_steps
from runs.kernel.txn import Txn
from runs.models import Run, RunStatus, Task, TaskStatus
from tenancy.models import Workspace


def tree_max_depth() -> int:
    return int(settings.OZ0_TREE_MAX_DEPTH)


def tree_max_children() -> int:
    return int(settings.OZ0_TREE_MAX_CHILDREN)


@dataclass(frozen=True)
class ChildPlan:
    """What a ready delegate task does: skip (its guard is false), fail (`refusal`), or start the
    child `request` compiled, having read the words of the steps in `words_of` (F15)."""

    guard_false: bool = False
    refusal: tuple[str, str] | None = None
    request: RunRequest | None = None
    words_of: set[str] = field(default_factory=set)


def plan_child(txn: Txn, task: Task) -> ChildPlan:
    """Decide whether a ready delegate task's child may start, and compile its request."""
    if task.spec.get("when") is not None and not _guard_holds(txn, task):
        return ChildPlan(guard_false=True)
    run = txn.run
    agent = str(task.spec.get("agent") or "")
    if run.depth + 1 > tree_max_depth():
        return ChildPlan(
            refusal=("tree_too_deep", f"a child of this run would be {run.depth + 1} deep; the cap is {tree_max_depth()}")
        )
    if Run.objects.filter(parent=run).count() >= tree_max_children():
        return ChildPlan(refusal=("too_many_children", f"this run has started {tree_max_children()} children, the cap"))
    child_input, words_of = task.spec.get("input"), set[str]()
    if has_templates(child_input) and task.spec.get("via") == "step":
        try:
            child_input, words_of = _rendered_input(txn, child_input)
        except TemplateError as error:
            return ChildPlan(refusal=("invalid_input", f"the step's input: {error}"))
    try:
        workspace = Workspace.objects.get(pk=run.workspace_id)
        request = compile_child(workspace, agent, child_input, private=run.private, priority=run.priority)
    except InvalidRequest as error:
        return ChildPlan(refusal=("agent_unavailable" if error.key == "unknown_agent" else error.key, error.detail))
    return ChildPlan(request=request, words_of=words_of)


def open_child(txn: Txn, task: Task, plan: ChildPlan) -> None:
    """Write the child run a plan allows and move the delegate task to running on it; the child's
    tasks are added when the parent's transaction commits."""
    request = plan.request
    assert request is not None, "a refused plan opens no child"
    run = txn.run
    agent = str(task.spec.get("agent") or "")
    via = str(task.spec.get("via") or "delegate")
    if plan.words_of:
        taint(txn, task.key, {"via": "template", "steps": sorted(plan.words_of)})
    version = request.agent_version
    child = Run.objects.create(
        id=request.run_id,
        workspace_id=run.workspace_id,
        agent_version=version,
        agent_name=version.agent.name if version else agent,
        created_by_id=run.created_by_id,
        private=run.private,
        input=request.input,
        deliverable=request.deliverable or "",
        # The child never escapes its parent's mode: each of its calls is decided by the stricter of
        # its own and its ancestors' (runs.kernel.approvals.call_decision).
        approval={**request.approval, "inherited": inherited_layers(run.pk, run.agent_name, run.approval or {})},
        retry_budget=request.retry_budget,
        parent=run,
        parent_task_key=task.key,
        depth=run.depth + 1,
        tainted=run.tainted,
        code_digest=code_digest(version.manifest) if version else "",
        priority=request.priority,
        rollout=request.rollout,
    )
    child_txn = Txn(run=child, actor=txn.actor)
    child_txn.event(
        None,
        "run_created",
        None,
        RunStatus.PENDING,
        data={
            "agent": child.agent_name or None,
            "version": version.version if version else None,
            "parent": str(run.pk),
            "parent_task": task.key,
            "via": via,
            **({"tainted": True} if child.tainted else {}),
        },
    )
    txn.open_child(child_txn, request.tasks)
    txn.move(
        task,
        TaskStatus.RUNNING,
        ready=False,
        child=child,
        attempt=task.attempt + 1,
        started_at=txn.now,
        cancel_requested=False,
        result={"child": str(child.pk), "agent": agent, "via": via},
    )
    txn.event(task.key, "child_started", data={"child": str(child.pk), "agent": agent, "via": via, "depth": child.depth})


def taint(txn: Txn, task_key: str | None, data: Mapping[str, Any]) -> None:
    """Mark the run tainted (F15), once, with the trace event that says how."""
    if txn.run.tainted:
        return
    txn.set_run(tainted=True)
    txn.event(task_key, "tainted", data=dict(data))


def _rendered_input(txn: Txn, template: Any) -> tuple[Any, set[str]]:
    """A step's input with its templates filled in from the flow's input and the settled steps it
    reads; and the steps whose words went in. Too large a result is the step's invalid input."""
    run_input = Run.objects.filter(pk=txn.run.pk).values_list("input", flat=True).first()
    value, words_of = render(template, run_input, _steps_read(txn, template_steps(template)))
    try:
        check_storable(value)
    except InvalidRequest as error:
        raise TemplateError(error.detail) from None
    return value, words_of


def _guard_holds(txn: Txn, task: Task) -> bool:
    """Evaluate a step's guard over the settled steps it reads."""
    node = parse_guard(task.spec["when"])
    return bool(evaluate_guard(node, _steps_read(txn, guard_steps(node))))


def _steps_read(txn: Txn, keys: set[str]) -> dict[str, dict[str, Any]]:
    """The settled steps a guard or a template reads: each one's status, output and failure
    (kind, flags, declared, message, job)."""
    read = txn.tasks_by_key(keys)
    steps: dict[str, dict[str, Any]] = {}
    for key, source in read.items():
        result = source.result or {}
        failure = None
        if source.status in FAILED_STATUSES:
            failure = failures.child_failure_of(result, content=True) or failures.task_failure(
                source.status, source.error_key, source.error_detail, content=True
            )
            failure = {**(failure or {}), "job": result.get("child")}
        steps[key] = {"status": source.status, "output": result.get("value"), "failure": failure}
    return steps
