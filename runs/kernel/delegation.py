"""Delegation (F14-F16): a delegate task's child run, started, settled and stopped.

A ready delegate task starts a child run of the named agent in the parent's own transaction (the
child is a new row nobody else can see yet, so no second run's lock is taken), with the parent's
workspace, creator and privacy; `child_started` on the parent and `run_created` on the child
record both sides. Everything after that crosses between two runs after commit, each side in a
transaction of its own (`Txn.tell`): a child's end settles the parent's task (`settle_parent`),
a parent's cancel or a task's stop cancels the child (`cancel_child`). Both are idempotent, and
`sweep_delegations` delivers again what a crash lost.

What a child's end means to its parent is decided once, under the parent's lock: a parent that
was asked to stop reads nothing from its child (its task is canceled); otherwise a child that
answered completes the task, and a child that failed fails it with `child_failed`, carrying the
child's failure as its own. A child canceled on its own (kind `cancelled`) is an answer for the
Ask agent and a quarantine, and fails the parent under `via: delegate`. A flow step's failure
follows the step's policy (runs.kernel.compile.flow_tasks) and the flow's end decides the flow
(runs.kernel.settling).

A flow step's input may hold templates (`runs.kernel.templates`), filled in as its child starts.
Words of another agent that go in that way come without their labels: the flow is marked
`tainted`, and so is the child that reads them; a tainted run's children start tainted (F15).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.db.models import Exists, OuterRef, Q

from runs import failures
from runs.kernel.approvals import inherited_layers
from runs.kernel.compile import check_storable, compile_child
from runs.kernel.errors import InvalidRequest
from runs.kernel.expansion import add_tasks
from runs.kernel.graph import FAILED_STATUSES, FINISHED_RUN_STATUSES, OPEN_RUN_STATUSES
from runs.kernel.guards import evaluate_guard, guard_steps, parse_guard
from runs.kernel.output_schemas import free_text_paths, schema_allows
from runs.kernel.scheduling import after_failure, release
from runs.kernel.settling import PAUSABLE, cancel, fail_run, pause, paused_by_parent, resume
from runs.kernel.templates import TemplateError, has_templates, render, template_steps
from runs.kernel.txn import Txn, install_child_starter, install_cross_run, locked
from runs.models import Run, RunStatus, Task, TaskStatus, Workspace

# What a child's end event may say: its status, kind and flags, never its words (F12).
CHILD_ENDED_FIELDS = ("kind", "retryable", "partial", "person", "declared")


def tree_max_depth() -> int:
    return int(settings.OZ0_TREE_MAX_DEPTH)


def tree_max_children() -> int:
    return int(settings.OZ0_TREE_MAX_CHILDREN)


def words_of(agent: Any, child_id: Any) -> str:
    """Whose words a child's failure message is (F14)."""
    return failures.words_of_child(agent, child_id)


def _start_child(txn: Txn, task: Task) -> None:
    """Start the child run of a ready delegate task, or fail the task when it may not start; a
    task whose `when:` guard is false is skipped (`condition_false`) and starts nothing (F17)."""
    if task.spec.get("when") is not None and not _guard_holds(txn, task):
        txn.move(
            task, TaskStatus.SKIPPED, ready=False, error=("condition_false", "the step's guard was false"), finished_at=txn.now
        )
        release(txn, [task.key])
        return
    run = txn.run
    agent = str(task.spec.get("agent") or "")
    via = str(task.spec.get("via") or "delegate")
    refusal: tuple[str, str] | None = None
    if run.depth + 1 > tree_max_depth():
        refusal = ("tree_too_deep", f"a child of this run would be {run.depth + 1} deep; the cap is {tree_max_depth()}")
    elif Run.objects.filter(parent=run).count() >= tree_max_children():
        refusal = ("too_many_children", f"this run has started {tree_max_children()} children, the cap")
    request = None
    child_input, words_of = task.spec.get("input"), set[str]()
    if refusal is None and has_templates(child_input) and task.spec.get("via") == "step":
        try:
            child_input, words_of = _rendered_input(txn, child_input)
        except TemplateError as error:
            refusal = ("invalid_input", f"the step's input: {error}")
    if refusal is None:
        try:
            workspace = Workspace.objects.get(pk=run.workspace_id)
            request = compile_child(workspace, agent, child_input, private=run.private)
        except InvalidRequest as error:
            refusal = ("agent_unavailable" if error.key == "unknown_agent" else error.key, error.detail)
    if refusal is not None or request is None:
        assert refusal is not None
        txn.move(task, TaskStatus.FAILED, ready=False, error=refusal, finished_at=txn.now, attempt=task.attempt + 1)
        after_failure(txn, task)
        return
    if words_of:
        taint(txn, task.key, {"via": "template", "steps": sorted(words_of)})
    version = request.agent_version
    child = Run.objects.create(
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
    add_tasks(child_txn, request.tasks)
    child_txn.check_run()
    child_txn.finish()
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


def settle_parent(child_id: str) -> bool:
    """A child run ended: settle its parent's delegate task (after the child's commit, under the
    parent's lock). False when there is nothing to settle (already settled, or not a child)."""
    child = (
        Run.objects.filter(pk=child_id).values("pk", "parent_id", "status", "failure", "output", "error", "agent_name").first()
    )
    if child is None or child["parent_id"] is None or child["status"] not in FINISHED_RUN_STATUSES:
        return False
    with locked(child["parent_id"], "delegation") as txn:
        task = Task.objects.filter(run=txn.run, kind="delegate", child_id=child["pk"], status=TaskStatus.RUNNING).first()
        if task is None:
            return False
        txn.remember([task])
        _settle(txn, task, child)
        return True


def _settle(txn: Txn, task: Task, child: Mapping[str, Any]) -> None:
    via = str(task.spec.get("via") or "delegate")
    agent = task.spec.get("agent")
    child_id = str(child["pk"])
    base = {"child": child_id, "agent": agent, "via": via}
    ended: dict[str, Any] = {**base, "status": child["status"]}
    failure = child["failure"] or failures.platform_failure("cancelled", None)
    if child["status"] != RunStatus.COMPLETED:
        ended.update({name: failure.get(name) for name in CHILD_ENDED_FIELDS})
    if txn.run.status == RunStatus.CANCELING or task.cancel_requested:
        # The parent was asked to stop before its child's end reached it: it reads nothing from
        # the child and never goes on from it (F16).
        txn.event(task.key, "child_ended", data={**ended, "decided": "parent_canceled"})
        txn.move(task, TaskStatus.CANCELED, error=("run_canceled", None), finished_at=txn.now, result=base)
        return
    if child["status"] == RunStatus.COMPLETED:
        value = child["output"]
        schema = task.spec.get("output_schema")
        if schema is not None:
            value = _as_value(value)
        if schema is not None and not schema_allows(schema, value):
            # A quarantined child's answer that does not fit its schema reaches the parent as a
            # failure with no words of the child's at all (F15).
            txn.event(task.key, "child_ended", data={**ended, "decided": "output_invalid"})
            txn.move(
                task,
                TaskStatus.FAILED,
                error=("child_output_invalid", f"the answer of {words_of(agent, child_id)} did not match the output_schema"),
                finished_at=txn.now,
                result=base,
            )
            after_failure(txn, task)
            return
        if via == "quarantine" and (free := free_text_paths(schema or {}, value)):
            # The schema let the child's own words through: they reach the parent's model without a
            # label's protection, so the parent is tainted as by any unlabelled words (F15).
            taint(txn, task.key, {"via": "quarantine", "child": child_id, "paths": free})
        txn.event(task.key, "child_ended", data={**ended, "decided": "answered"})
        txn.move(task, TaskStatus.COMPLETED, result={**base, "value": value}, finished_at=txn.now)
        release(txn, [task.key])
        return
    carried: dict[str, Any] = {name: failure.get(name) for name in failures.FAILURE_FIELDS}
    if via == "quarantine":
        carried["message"] = None
        carried["error_type"] = _error_type(child_id)
    self_canceled = failure.get("kind") == "cancelled"
    # Under oz.delegate a child canceled on its own fails the parent (F16). A flow step's failure
    # follows its policy: an error branch reads it, else the flow fails with it once every step has
    # settled (runs.kernel.settling).
    fails_parent = self_canceled and via == "delegate"
    decided = "fails_parent" if fails_parent else "failed"
    txn.event(task.key, "child_ended", data={**ended, "decided": decided})
    detail = f"{words_of(agent, child_id)} failed with kind {failure.get('kind')}"
    txn.move(
        task,
        TaskStatus.FAILED,
        error=(failures.CHILD_FAILED_ERROR_KEY, detail),
        finished_at=txn.now,
        result={**base, "failure": carried},
    )
    if decided == "fails_parent":
        fail_run(txn, carried, detail, task)
        return
    after_failure(txn, task)


def _as_value(output: Any) -> Any:
    """An agent's answer is its final text: a quarantine reads text holding JSON as that JSON, so
    a schema can ask for an object (F15)."""
    if isinstance(output, str):
        try:
            return json.loads(output)
        except ValueError:
            return output
    return output


def _error_type(child_id: str) -> str:
    """The type of a quarantined child's error: its first failed step's error key, never words."""
    key = (
        Task.objects.filter(run_id=child_id, status__in=FAILED_STATUSES)
        .order_by("position")
        .values_list("error_key", flat=True)
        .first()
    )
    return key or "run_canceled"


def cancel_child(child_id: str) -> bool:
    """The parent stopped (or its delegate task did): cancel the child, which cancels its own
    children in turn (F16). False when the child had already ended or was being canceled."""
    with locked(child_id, "parent") as txn:
        if txn.run.status not in OPEN_RUN_STATUSES:
            return False
        cancel(txn, reason="the parent run was canceled", failure=None, step=None)
        return True


def pause_child(child_id: str) -> bool:
    """The parent paused: pause the child, which pauses its own children in turn. False when the
    child is not running (ended, held, being canceled, or already paused)."""
    with locked(child_id, "parent") as txn:
        if txn.run.status not in PAUSABLE:
            return False
        pause(txn, {"verb": "pause", "by": "parent"})
        return True


def resume_child(child_id: str) -> bool:
    """The parent resumed: resume the child if the parent's pause is what paused it."""
    with locked(child_id, "parent") as txn:
        if txn.run.status != RunStatus.PAUSED or not paused_by_parent(txn.run):
            return False
        resume(txn, {"verb": "resume", "by": "parent"})
        return True


def sweep_delegations(limit: int = 500) -> int:
    """Deliver again what a crash between two runs' transactions lost: the settle of a delegate
    task whose child has ended, the cancel of a child whose parent (or task) has stopped, and the
    pause or resume of a child whose parent paused or resumed."""
    settles = list(
        Task.objects.filter(kind="delegate", status=TaskStatus.RUNNING, child__status__in=FINISHED_RUN_STATUSES).values_list(
            "child_id", flat=True
        )[:limit]
    )
    for child_id in settles:
        settle_parent(str(child_id))
    stopped_task = Task.objects.filter(run=OuterRef("parent"), key=OuterRef("parent_task_key"), child=OuterRef("pk")).filter(
        Q(cancel_requested=True) | Q(status=TaskStatus.CANCELED)
    )
    orphans = list(
        Run.objects.filter(status__in=OPEN_RUN_STATUSES, parent__isnull=False)
        .filter(Q(parent__status__in=(RunStatus.CANCELING, RunStatus.CANCELED)) | Exists(stopped_task))
        .values_list("pk", flat=True)[:limit]
    )
    for child_id in orphans:
        cancel_child(str(child_id))
    unpaused = list(Run.objects.filter(status__in=PAUSABLE, parent__status=RunStatus.PAUSED).values_list("pk", flat=True)[:limit])
    for child_id in unpaused:
        pause_child(str(child_id))
    still_paused = list(
        Run.objects.filter(status=RunStatus.PAUSED, parent__status=RunStatus.RUNNING).values_list("pk", flat=True)[:limit]
    )
    resumed = sum(resume_child(str(child_id)) for child_id in still_paused)
    return len(settles) + len(orphans) + len(unpaused) + resumed


install_child_starter(_start_child)
install_cross_run("settle_parent", settle_parent)
install_cross_run("cancel_child", cancel_child)
install_cross_run("pause_child", pause_child)
install_cross_run("resume_child", resume_child)
