"""Run-level settling: quiescence, holds, attention stamps, announcements, cancels and findings.

A transaction's moves make these due (`Txn.check_run`, `restamp`, `announce`) and its commit
(runs.kernel.commit) runs them once, before it writes: `settle_run`, `restamp_run` and
`announce_asks` are the transaction's run-level steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db.models import Q

from runs import failures
from runs.fingerprints import failure_fingerprint
from runs.kernel import graph
from runs.kernel.errors import Conflict
from runs.kernel.graph import (
    ASKING_STATUSES,
    FAILED_STATUSES,
    FINISHED_RUN_STATUSES,
    LIVE_STATUSES,
    OPEN_RUN_STATUSES,
    WORKING_RUN_STATUSES,
)
from runs.kernel.scheduling import make_ready, start
from runs.kernel.txn import Txn
from runs.models import Finding, Run, RunStatus, Task, TaskStatus, TraceEvent


def _busy(txn: Txn) -> bool:
    """Whether the run has live or queued work. A task this transaction holds is as its row will
    be at commit (every move under the lock goes through the transaction), so one of them live or
    queued answers without asking the table: an append that queued calls, a settle that claimed."""
    if any(t.status in LIVE_STATUSES or (t.status == TaskStatus.WAITING and t.ready) for t in txn.cache.values()):
        return True
    return (
        Task.objects.filter(run=txn.run).filter(Q(status__in=LIVE_STATUSES) | Q(status=TaskStatus.WAITING, ready=True)).exists()
    )


def _pending_failures(run: Run) -> list[tuple[str, str]]:
    """The unresolved failures that hold the run, in graph order: (key, failure kind). A delegate
    task whose child failed holds with the child's kind (F14), not its error key's."""
    rows = (
        Task.objects.filter(run=run, status__in=FAILED_STATUSES, failure_resolution__isnull=True)
        .filter(~Q(on_failure="absorb") | Q(status=TaskStatus.UNCERTAIN))
        .order_by("position")
        .values_list("key", "status", "on_failure", "failure_resolution", "error_key", "result")
    )
    return [
        (key, failures.task_kind(error_key, result))
        for key, status, policy, resolution, error_key, result in rows
        if graph.is_pending_failure(status, policy, resolution)
    ]


def _halt_stamp(pending: list[tuple[str, str]]) -> dict[str, Any]:
    """The attention of a run held on failures: which tasks, and the kinds they failed with."""
    return {
        "reason": "halt_failure",
        "blocked_task_keys": [key for key, _ in pending],
        "kinds": list(dict.fromkeys(kind for _, kind in pending)),
    }


def wake_parked(txn: Txn) -> None:
    """Harnessed sessions parked on a call that has left a person's hands (issue 29: waits hold
    nothing) are queued for a session worker again, which resumes them from their stored state;
    the call answers from the journal. A run being canceled or finished wakes nothing: its
    parked round is settled with the run."""
    if txn.run.status not in OPEN_RUN_STATUSES:
        return
    # (In a paused run a woken round is queued and starts with the resume: make_ready.)
    ended = set(txn.asks_ended)
    rounds = {key.rsplit(".", 1)[0] for key in ended if "." in key}
    parked = Task.objects.filter(run=txn.run, key__in=rounds, kind="round", status=TaskStatus.WAITING, ready=False)
    for task in parked:
        on = (task.state.get("parked") or {}).get("on")
        if on not in ended:
            continue
        task = txn.cache.get(task.key, task)
        txn.remember([task])
        txn.event(task.key, "session_woken", data={"on": on})
        make_ready(txn, task)
    txn.flush()


def settle_run(txn: Txn) -> None:
    """Judge the run's quiescence: finish a cancel, complete, hold, or release a hold."""
    run = txn.run
    if run.status == RunStatus.CANCELING:
        if not Task.objects.filter(run=run, status__in=LIVE_STATUSES).exists():
            leftovers = list(Task.objects.filter(run=run, status=TaskStatus.WAITING))
            if leftovers:
                txn.move_many(leftovers, TaskStatus.CANCELED, ready=False, error=("run_canceled", None), finished_at=txn.now)
            _finish_canceled(txn)
        return
    if run.status not in WORKING_RUN_STATUSES:
        return
    if _busy(txn):
        if run.status == RunStatus.NEEDS_ATTENTION:
            release_hold(txn)
        return
    pending = _pending_failures(run)
    if pending:
        _hold(txn, _halt_stamp(pending))
        return
    deliverable = Task.objects.filter(run=run, key=run.deliverable).first()
    if deliverable is not None and deliverable.status == TaskStatus.COMPLETED and _settled_on_a_failure(txn, deliverable):
        return
    if deliverable is not None and deliverable.status == TaskStatus.COMPLETED:
        output = (deliverable.result or {}).get("value")
        txn.set_run(output=output, attention=None, held_since=None, finished_at=txn.now, announcements=[])
        txn.move_run(RunStatus.COMPLETED)
        return
    cause = _failure_behind(txn, deliverable)
    _hold(
        txn,
        {
            "reason": "deliverable_unresolved",
            "blocked_task_keys": [run.deliverable],
            "kinds": [failures.task_kind(cause.error_key, cause.result)] if cause is not None else [],
        },
    )


def _settled_on_a_failure(txn: Txn, deliverable: Task) -> bool:
    """A flow's end (a `settled` join) reached with a step's failure no later step read (it
    propagated, unresolved): the flow fails with that step's failure, the first in the manifest's
    order (F17), its message labelled with whose words it is. True when it did."""
    if deliverable.kind != "join" or deliverable.spec.get("mode") != "settled":
        return False
    sources = txn.tasks_by_key(deliverable.after)
    failed = next(
        (
            sources[key]
            for key in deliverable.after
            if key in sources
            and sources[key].status in FAILED_STATUSES
            and sources[key].on_failure != "absorb"
            and sources[key].failure_resolution is None
        ),
        None,
    )
    if failed is None:
        return False
    carried = failures.child_failure_of(failed.result, content=True)
    if carried is not None:
        result = failed.result or {}
        failure = {**carried, "words_of": failures.words_of_child(result.get("agent"), result.get("child"))}
    else:
        # The step never had a child to speak (its agent is gone, a cap): oz0's own words.
        kind = failures.kind_for_error_key(failed.error_key)
        failure = {**failures.platform_failure(kind, failed.error_detail), "words_of": "oz0"}
    fail_run(txn, failure, failed.error_detail or failed.error_key or "a step failed", failed)
    # Every step has settled: the cancel has nothing to wait for, and the flow ends now.
    settle_run(txn)
    return True


def _failure_behind(txn: Txn, task: Task | None) -> Task | None:
    """The failed task that left `task` unresolved: itself, or the failure its skip came from."""
    if task is None:
        return None
    if task.status in FAILED_STATUSES:
        return task
    if task.status == TaskStatus.SKIPPED and task.skipped_by:
        cause = txn.tasks_by_key([task.skipped_by]).get(task.skipped_by)
        if cause is not None and cause.status in FAILED_STATUSES:
            return cause
    return None


def _hold(txn: Txn, attention: dict[str, Any]) -> None:
    """Rest the run on a person (S13, S18). A hold on a failure carries that failure, as a cancel
    would (F1): the first blocked task's kind and flags, with its error's words as the message."""
    run = txn.run
    if run.attention != attention:
        txn.set_run(attention=attention)
        txn.event(None, "attention", data=attention)
    if run.held_since is None:
        txn.set_run(held_since=txn.now)
    failure, step = hold_failure(txn, attention)
    if run.failure != failure:
        txn.set_run(failure=failure)
    txn.move_run(RunStatus.NEEDS_ATTENTION)
    if failure is not None:
        _record_finding(txn, failure, step)


def hold_failure(txn: Txn, attention: Mapping[str, Any]) -> tuple[dict[str, Any] | None, Task | None]:
    keys = attention.get("blocked_task_keys") or []
    if not keys:
        return None, None
    blocked = txn.tasks_by_key([keys[0]]).get(keys[0])
    cause = _failure_behind(txn, blocked)
    if cause is None:
        return None, None
    if cause.error_key == failures.CHILD_FAILED_ERROR_KEY:
        # A delegate task whose child failed holds the parent with the child's kind (F14).
        carried = failures.child_failure_of(cause.result, content=True)
        if carried is not None:
            return carried, cause
    return failures.platform_failure(failures.kind_for_error_key(cause.error_key), cause.error_detail), cause


def release_hold(txn: Txn) -> None:
    txn.set_run(held_since=None, failure=None)
    txn.move_run(RunStatus.RUNNING)
    txn.restamp()


def restamp_run(txn: Txn) -> None:
    """Keep run.attention true to the live asks and pending failures; a standing stamp is
    never replaced by another reason while its own cause remains (S21)."""
    run = txn.run
    if run.status in (RunStatus.COMPLETED, RunStatus.CANCELED, RunStatus.CANCELING):
        return
    if run.status == RunStatus.NEEDS_ATTENTION:
        return  # the hold's own stamp stands until the hold is released
    asks = list(
        Task.objects.filter(run=run, status=TaskStatus.AWAITING_INPUT, composed=True)
        .order_by("position")
        .values_list("key", flat=True)
    )
    pending = _pending_failures(run)
    current = (run.attention or {}).get("reason")
    stamp: dict[str, Any] | None
    if current == "halt_failure" and pending:
        stamp = _halt_stamp(pending)
    elif current == "awaiting_human" and asks:
        stamp = {"reason": "awaiting_human", "blocked_task_keys": asks}
    elif pending:
        stamp = _halt_stamp(pending)
    elif asks:
        stamp = {"reason": "awaiting_human", "blocked_task_keys": asks}
    else:
        stamp = None
    if stamp != run.attention:
        txn.set_run(attention=stamp)
        txn.event(None, "attention", data=stamp)


def announce_asks(txn: Txn) -> None:
    """Keep run.announcements true to the model-composed asks."""
    run = txn.run
    statuses = set(Task.objects.filter(run=run, status__in=ASKING_STATUSES, composed=True).values_list("status", flat=True))
    announcements = []
    if run.status not in FINISHED_RUN_STATUSES:
        if TaskStatus.NEEDS_APPROVAL in statuses:
            announcements.append("approval_required")
        if TaskStatus.AWAITING_INPUT in statuses:
            announcements.append("awaiting_human")
    if announcements != list(run.announcements):
        txn.set_run(announcements=announcements)
        for name in set(announcements) - set(run.announcements or []):
            txn.event(None, "announced", data={"announcement": name})


def _finish_canceled(txn: Txn) -> None:
    run = txn.run
    txn.set_run(finished_at=txn.now, announcements=[], held_since=None)
    txn.move_run(RunStatus.CANCELED)
    _record_finding(txn, run.failure or failures.platform_failure("cancelled", None), txn.finding_step)


def _record_finding(txn: Txn, failure: Mapping[str, Any], step: Task | None) -> None:
    """Count the run as failed, by kind, once (F18): when it first holds on a failure, or when it
    ends canceled having never held on one. A later hold or the cancel of a counted run adds
    nothing, so the rollups the triggers keep count runs, not episodes; repairs count apart."""
    run = txn.run
    if Finding.objects.filter(run_id=run.id).exists():
        return
    error_key = (step.error_key or "") if step else ""
    Finding.objects.create(
        run_id=run.id,
        workspace_id=run.workspace_id,
        agent_name=run.agent_name,
        agent_version=run.agent_version.version if run.agent_version_id else None,  # type: ignore[union-attr]
        kind=failure["kind"],
        retryable=failure["retryable"],
        partial=failure["partial"],
        person=failure["person"],
        declared=failure["declared"],
        step_key=step.key if step else "",
        step_kind=step.kind if step else "",
        error_key=error_key,
        attempts=step.attempt if step else 0,
        created_at=txn.now,
        fingerprint=failure_fingerprint(
            kind=failure["kind"], agent=run.agent_name, error_key=error_key, message=failure.get("message")
        ),
    )


def cancel(txn: Txn, *, reason: str, failure: dict[str, Any] | None, step: Task | None) -> None:
    run = txn.run
    if run.status in FINISHED_RUN_STATUSES:
        raise Conflict("run_finished", f"the run is already {run.status}")
    if run.status == RunStatus.CANCELING:
        raise Conflict("run_canceling", "the run is already being canceled")
    if failure is None:
        failure, step = _cancel_failure(txn, reason)
    txn.finding_step = step
    txn.set_run(failure=failure, error=run.error or "canceled", attention=None)
    txn.event(None, "verb", data={"verb": "cancel", "message": reason or None})
    txn.move_run(RunStatus.CANCELING)
    unstarted = list(
        Task.objects.filter(run=run).filter(
            Q(status__in=(TaskStatus.WAITING, TaskStatus.NEEDS_APPROVAL, TaskStatus.AWAITING_INPUT))
            | Q(status=TaskStatus.DISPATCHED, claim__isnull=True)
        )
    )
    unstarted = [txn.cache.get(t.key, t) for t in unstarted]
    if unstarted:
        txn.move_many(
            unstarted, TaskStatus.CANCELED, ready=False, error=("run_canceled", None), finished_at=txn.now, deadline_at=None
        )
    Task.objects.filter(run=run).filter(
        Q(status=TaskStatus.RUNNING) | Q(status=TaskStatus.DISPATCHED, claim__isnull=False)
    ).update(cancel_requested=True)
    # Every running child is told to stop (F16); the run stays canceling until they have ended.
    for child_id in Task.objects.filter(run=run, kind="delegate", status=TaskStatus.RUNNING, child__isnull=False).values_list(
        "child_id", flat=True
    ):
        txn.tell("cancel_child", str(child_id))
    txn.check_run()


PAUSABLE = (RunStatus.PENDING, RunStatus.RUNNING)


def pause(txn: Txn, data: Mapping[str, Any]) -> None:
    """Pause the run (nothing more starts; calls in flight finish) and, after commit, each of its
    open children, which pause theirs in turn: a job tree pauses whole."""
    if txn.run.status not in PAUSABLE:
        raise Conflict("not_pausable", f"the run is {txn.run.status}")
    txn.event(None, "verb", data=dict(data))
    txn.move_run(RunStatus.PAUSED)
    for child_id in Run.objects.filter(parent=txn.run, status__in=PAUSABLE).values_list("pk", flat=True):
        txn.tell("pause_child", str(child_id))


def resume(txn: Txn, data: Mapping[str, Any]) -> None:
    """Resume a paused run: its ready tasks start; children its pause paused resume after commit
    (a child someone paused on their own stays paused)."""
    if txn.run.status != RunStatus.PAUSED:
        raise Conflict("not_paused", f"the run is {txn.run.status}")
    txn.event(None, "verb", data=dict(data))
    txn.move_run(RunStatus.RUNNING)
    ready = list(Task.objects.filter(run=txn.run, status=TaskStatus.WAITING, ready=True).order_by("position"))
    txn.remember(ready)
    for task in ready:
        start(txn, task)
    txn.check_run()
    for child_id in Run.objects.filter(parent=txn.run, status=RunStatus.PAUSED).values_list("pk", flat=True):
        txn.tell("resume_child", str(child_id))


def paused_by_parent(run: Run) -> bool:
    """Whether the run's latest pause came from its parent's (not a person's on this run)."""
    data = (
        TraceEvent.objects.filter(run=run, event="verb", data__verb="pause")
        .order_by("-seq")
        .values_list("data", flat=True)
        .first()
    )
    return isinstance(data, dict) and data.get("by") == "parent"


def _cancel_failure(txn: Txn, reason: str) -> tuple[dict[str, Any], Task | None]:
    """SPEC.md: a person canceling a held run fails it with the hold's own kind; else `cancelled`."""
    run = txn.run
    if run.status == RunStatus.NEEDS_ATTENTION:
        failure, step = hold_failure(txn, run.attention or {})
        if failure is not None:
            return {**failure, "message": reason or None}, step
    return failures.platform_failure("cancelled", reason or None), None


def fail_run(txn: Txn, failure: dict[str, Any], error_text: str, step: Task) -> None:
    """End the run canceled with an agent's own failure (oz.fail)."""
    txn.set_run(error=error_text)
    cancel(txn, reason="", failure=failure, step=step)
