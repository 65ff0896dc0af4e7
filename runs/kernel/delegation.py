"""Delegation (F14-F16): what a child's end, or a parent's stop, means to the other run.

A delegate task's child is opened in the parent's own transaction (runs.kernel.children).
Everything after that crosses between two runs after commit, each side in a transaction of its
own (`Txn.tell`, delivered by runs.kernel.commit): a child's end settles the parent's task
(`settle_delegate`), a parent's cancel or a task's stop cancels the child (`cancel_as_child`),
a parent's pause and resume reach its children. Each is idempotent, and the delegation sweep
(runs.kernel.sweeps) delivers again what a crash lost.

What a child's end means to its parent is decided once, under the parent's lock: a parent that
was asked to stop reads nothing from its child (its task is canceled); otherwise a child that
answered completes the task, and a child that failed fails it with `child_failed`, carrying the
child's failure as its own. A child canceled on its own (kind `cancelled`) is an answer for the
Ask agent and a quarantine, and fails the parent under `via: delegate`. A flow step's failure
follows the step's policy (runs.kernel.compile.flow_tasks) and the flow's end decides the flow
(runs.kernel.settling).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from runs import failures
from runs.kernel.children import taint
from runs.kernel.graph import FAILED_STATUSES, FINISHED_RUN_STATUSES, OPEN_RUN_STATUSES
from runs.kernel.output_schemas import free_text_paths, schema_allows
from runs.kernel.scheduling import after_failure, release
from runs.kernel.settling import PAUSABLE, cancel, fail_run, pause, paused_by_parent, resume
from runs.kernel.txn import Txn
from runs.models import Run, RunStatus, Task, TaskStatus

# What a child's end event may say: its status, kind and flags, never its words (F12).
CHILD_ENDED_FIELDS = ("kind", "retryable", "partial", "person", "declared")


def words_of(agent: Any, child_id: Any) -> str:
    """Whose words a child's failure message is (F14)."""
    return failures.words_of_child(agent, child_id)


def ended_child(child_id: str) -> Mapping[str, Any] | None:
    """A child run that has ended, as its parent reads it; None for a run that is no child or
    has not ended."""
    child = (
        Run.objects.filter(pk=child_id).values("pk", "parent_id", "status", "failure", "output", "error", "agent_name").first()
    )
    if child is None or child["parent_id"] is None or child["status"] not in FINISHED_RUN_STATUSES:
        return None
    return child


def settle_delegate(txn: Txn, child: Mapping[str, Any]) -> bool:
    """Settle the parent's delegate task (this transaction's run) on its child's end. False when
    there is nothing to settle (already settled)."""
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
        txn.complete([(task, value)], result=base, finished_at=txn.now)
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


def cancel_as_child(txn: Txn) -> bool:
    """The parent stopped (or its delegate task did): cancel this child run, which cancels its own
    children in turn (F16). False when the child had already ended or was being canceled."""
    if txn.run.status not in OPEN_RUN_STATUSES:
        return False
    cancel(txn, reason="the parent run was canceled", failure=None, step=None)
    return True


def pause_as_child(txn: Txn) -> bool:
    """The parent paused: pause this child run, which pauses its own children in turn. False when
    the child is not running (ended, held, being canceled, or already paused)."""
    if txn.run.status not in PAUSABLE:
        return False
    pause(txn, {"verb": "pause", "by": "parent"})
    return True


def resume_as_child(txn: Txn) -> bool:
    """The parent resumed: resume this child run if the parent's pause is what paused it."""
    if txn.run.status != RunStatus.PAUSED or not paused_by_parent(txn.run):
        return False
    resume(txn, {"verb": "resume", "by": "parent"})
    return True
