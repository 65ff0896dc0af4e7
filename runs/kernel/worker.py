"""The worker protocol: claim queued work, prove the claim alive, report how it ended.

A report is accepted only while its claim holds (compare-and-set on the task's status and
claim); a lost claim (a cancel, a sweep, a lost race) answers False and changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from runs.kernel.bulk import claim_named
from runs.kernel.commit import locked, send_on_commit
from runs.kernel.failure import fail_claimed
from runs.kernel.graph import KERNEL_EXECUTED, WORKING_RUN_STATUSES
from runs.kernel.holder_sessions import worker_of
from runs.kernel.priorities import WAITING_KEY, by_effective_priority
from runs.kernel.scheduling import after_failure, approval_holds, release, round_deadline, tool_deadline
from runs.kernel.txn import Txn
from runs.models import Run, RunStatus, Task, TaskStatus, TraceEvent
from runs.tools import get_tool, tool_names

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Claimed:
    """What a worker is given when it takes a task: every renewal and report names it back."""

    task_id: int
    run_id: str
    key: str
    kind: str
    spec: dict[str, Any]
    attempt: int
    claim: str
    state: dict[str, Any]
    lineage: str


@dataclass(frozen=True)
class Outcome:
    """What a worker says of one call of a batch: a value, a typed error, or that it stopped."""

    claimed: Claimed
    value: Any = None
    error: tuple[str, str | None] | None = None
    stopped: bool = False


def session_room(run_id: Any, per_workspace: int) -> bool:
    """Whether the run's workspace holds fewer than `per_workspace` running sessions (a glance:
    `claim_session` is the check that holds)."""
    workspace_id = Run.objects.filter(pk=run_id).values_list("workspace_id", flat=True).first()
    return workspace_id is None or running_sessions(workspace_id) < per_workspace


def defer_queued(task_id: int) -> None:
    """A queued task a worker sends again later (a call over its workspace's share): its queue
    time restarts, so the lost-message sweep does not take it for lost meanwhile, and the first
    time it found no room is kept in its state (`waiting_for_share`): its priority ages from it."""
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE runs_task SET queued_at = %s, state = CASE WHEN state ? %s THEN state"
            " ELSE state || jsonb_build_object(%s, jsonb_build_object('since', %s::text)) END"
            " WHERE id = %s AND status = 'waiting' AND ready",
            [now, WAITING_KEY, WAITING_KEY, now.isoformat(), task_id],
        )


def claimed_from(task: Task) -> Claimed:
    """The `Claimed` a claimant of `task` (as the row stands, claimed) is given."""
    assert task.claim is not None
    return Claimed(task.pk, str(task.run_id), task.key, task.kind, task.spec, task.attempt, task.claim, task.state, task.lineage)


class NoRoom:
    """What `claim_task` answers when the run's workspace already holds its share of the workers."""

    def __repr__(self) -> str:
        return "NO_ROOM"


NO_ROOM = NoRoom()
# pg_advisory_xact_lock's first key for the per-workspace share (the second is the workspace's id).
SHARE_LOCK = 2027


def workers_held(workspace_id: int) -> int:
    """The worker processes the workspace's calls and rounds hold now: one per claim (a chunk of
    quick calls shares one claim, one message, one process). Harnessed rounds (F7) are not
    counted: they hold a session thread, under their own cap (`session_room`)."""
    return (
        Task.objects.filter(
            status=TaskStatus.RUNNING, claim__isnull=False, kind__in=KERNEL_EXECUTED, run__workspace_id=workspace_id
        )
        .exclude(kind="round", run__agent_version__manifest__harness__has_key="kind")
        .values("claim")
        .distinct()
        .count()
    )


def _room(workspace_id: int, per_workspace: int) -> int:
    """How many more workers the workspace may hold. A hard cap: claims of one workspace take its
    share lock in turn, so two cannot both see room for the last slot (the lock is held to the
    claim's commit)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [SHARE_LOCK, workspace_id])
    return per_workspace - workers_held(workspace_id)


def _has_room(workspace_id: int, per_workspace: int) -> bool:
    return _room(workspace_id, per_workspace) > 0


def send_within_share(run_id: Any, per_workspace: int) -> list[int]:
    """A worker of the run's workspace came free: send that workspace's queued tool calls and
    model rounds of the highest effective priority (runs.kernel.priorities: the run's priority,
    aged by the call's wait), as many as it has room for, to the back of the queue.

    A call that found no room was not sent again (its message, acknowledged, would otherwise come
    back to a worker again and again, or wait in a worker's hands as a delayed message): it waits
    in the database until its workspace has room, and this hands it on. Should this never run
    (its worker lost), the lost-message sweep sends it again after OZ0_REQUEUE_SECONDS."""

    quick = [name for name in tool_names() if (tool := get_tool(name)) is not None and tool.quick]
    with transaction.atomic():
        workspace_id = Run.objects.filter(pk=run_id).values_list("workspace_id", flat=True).first()
        if workspace_id is None:
            return []
        room = _room(workspace_id, per_workspace)
        if room <= 0:
            return []
        now = timezone.now()
        queued = list(
            by_effective_priority(
                Task.objects.filter(
                    status=TaskStatus.WAITING,
                    ready=True,
                    kind__in=KERNEL_EXECUTED,
                    run__workspace_id=workspace_id,
                    run__status__in=WORKING_RUN_STATUSES,
                )
                .exclude(kind="tool", spec__tool__in=quick)
                .exclude(kind="round", run__agent_version__manifest__harness__has_key="kind"),
                now,
            ).values_list("pk", "run_id", "run__priority")[:room]
        )
        Task.objects.filter(pk__in=[pk for pk, _, _ in queued]).update(queued_at=now)
        by_run: dict[Any, list[int]] = {}
        priorities: dict[Any, int] = {}
        for pk, run, priority in queued:
            by_run.setdefault(run, []).append(pk)
            priorities[run] = priority
        for run, ids in by_run.items():
            send_on_commit(ids, run, priority=priorities[run])
    return [pk for pk, _, _ in queued]


def claim_task(run_id: Any, task_id: int, claim: str, *, per_workspace: int = 0) -> Claimed | NoRoom | None:
    """Take a queued task for execution. A redelivered or duplicate message finds nothing to take.
    `run_id` may be None (a message sent without it): then the task's row names its run.

    With `per_workspace`, a tool call or model round whose workspace already holds that many
    workers is not taken: NO_ROOM, and the task stays queued for its message to come again
    later (`send_within_share`, when one of the workspace's workers comes free)."""
    if run_id is None:
        run_id = Task.objects.filter(pk=task_id).values_list("run_id", flat=True).first()
        if run_id is None:
            return None
    with locked(run_id, "worker") as txn:
        if txn.run.status not in WORKING_RUN_STATUSES:
            return None
        task = Task.objects.filter(pk=task_id, status=TaskStatus.WAITING, ready=True).first()
        if task is None or task.kind not in KERNEL_EXECUTED:
            return None
        txn.remember([task])
        return _claim_held(txn, task, claim, per_workspace=per_workspace)


# The advisory lock's first key: the session slots of one workspace (the second is its id's hash).
SESSION_SLOTS_LOCK = 25_008


@dataclass(frozen=True)
class SessionClaim:
    """What a session worker is given: the claim, or None; `full` when the workspace had no slot."""

    claimed: Claimed | None
    full: bool = False


def claim_session(run_id: Any, task_id: int, claim: str, per_workspace: int) -> SessionClaim:
    """Take a queued harnessed round (F7) for a session thread, unless its workspace already holds
    `per_workspace` running sessions: a hard cap. The count and the claim are one transaction under
    a PostgreSQL advisory lock of the workspace's, so two workers never both take its last slot.
    A round left waiting for a slot says so once (`session_waiting` in the trace, `waiting_for_slot`
    in its state, shown by the run's document and page) until a slot is free."""
    if run_id is None:
        run_id = Task.objects.filter(pk=task_id).values_list("run_id", flat=True).first()
        if run_id is None:
            return SessionClaim(None)
    with locked(run_id, "worker") as txn:
        if txn.run.status not in WORKING_RUN_STATUSES:
            return SessionClaim(None)
        task = Task.objects.filter(pk=task_id, status=TaskStatus.WAITING, ready=True).first()
        if task is None or task.kind not in KERNEL_EXECUTED:
            return SessionClaim(None)
        txn.remember([task])
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [SESSION_SLOTS_LOCK, str(txn.run.workspace_id)])
        running = running_sessions(txn.run.workspace_id)
        if running >= per_workspace:
            waiting = {"since": txn.now.isoformat(), "slots": per_workspace}
            fields: dict[str, Any] = {"queued_at": txn.now}
            if "waiting_for_slot" not in task.state:
                task.state = {**task.state, "waiting_for_slot": waiting}
                fields["state"] = task.state
                txn.event(task.key, "session_waiting", data={"running": running, "slots": per_workspace})
            Task.objects.filter(pk=task.pk, status=TaskStatus.WAITING).update(**fields)
            txn.skip_check_run()
            return SessionClaim(None, full=True)
        if "waiting_for_slot" in task.state or "released" in task.state:
            # (`released`: left by a session whose worker was lost while it waited on a person.)
            task.state = {k: v for k, v in task.state.items() if k not in ("waiting_for_slot", "released")}
            Task.objects.filter(pk=task.pk).update(state=task.state)
        claimed = _claim_held(txn, task, claim)  # a session's share is the cap above, not the workers'
        return SessionClaim(None if isinstance(claimed, NoRoom) else claimed)


def running_sessions(workspace_id: Any) -> int:
    """The workspace's harnessed rounds holding a session thread (running, claimed): a released
    one (waiting on a person, its process kept by the keeper, runs.kernel.releases) holds none."""
    return (
        Task.objects.filter(
            kind="round",
            status=TaskStatus.RUNNING,
            claim__isnull=False,
            run__workspace_id=workspace_id,
            run__agent_version__manifest__harness__has_key="kind",
        )
        .exclude(state__has_key="released")
        .count()
    )


def _claim_held(txn: Txn, task: Task, claim: str, *, per_workspace: int = 0) -> Claimed | NoRoom | None:
    """Claim a queued task the transaction holds under the run lock (past the approval gate, and
    within its workspace's share of the workers when `per_workspace` is given)."""
    if not approval_holds(txn, task):
        return None
    if per_workspace > 0 and not _has_room(txn.run.workspace_id, per_workspace):
        return NO_ROOM
    if WAITING_KEY in task.state:
        # Its wait is over: a later wait (a retry's) ages from its own start.
        task.state = {k: v for k, v in task.state.items() if k != WAITING_KEY}
        Task.objects.filter(pk=task.pk).update(state=task.state)
    txn.move(
        task,
        TaskStatus.RUNNING,
        ready=False,
        claim=claim,
        heartbeat_at=txn.now,
        started_at=txn.now,
        attempt=task.attempt + 1,
        cancel_requested=False,
        deadline_at=tool_deadline(task.spec, txn.now)
        if task.kind == "tool"
        else (round_deadline(txn.run, txn.now) if task.kind == "round" else None),
    )
    # Taking a queued task cannot make the run quiescent: skip the settle queries.
    txn.skip_check_run()
    return claimed_from(task)


def heartbeat(claim: str) -> bool:
    """Prove a claimant alive (of one call, or of a batch's calls, which share one claim). True
    when the kernel wants it to stop: a cancel asked, or the claim is gone (a cancel, a lost race
    or a sweep won)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE runs_task SET heartbeat_at = %s WHERE claim = %s AND status = 'running' RETURNING cancel_requested",
            [timezone.now(), claim],
        )
        rows = cursor.fetchall()
    return not rows or any(row[0] for row in rows)


def held_task(txn: Txn, claimed: Claimed) -> Task | None:
    """The claimed task, while its claim still holds (a runner's call stays dispatched under its lease).
    None refuses the report; a claim the lease sweep took is recorded (`lease_lost`)."""
    task = Task.objects.filter(
        pk=claimed.task_id, run=txn.run, claim=claimed.claim, status__in=(TaskStatus.RUNNING, TaskStatus.DISPATCHED)
    ).first()
    if task is not None:
        txn.remember([task])
    else:
        record_lost_lease(txn, [claimed])
    return task


def record_lost_lease(txn: Txn, refused: Sequence[Claimed]) -> None:
    """Reports refused because the lease sweep took their claims: the holder stopped heartbeating
    past its lease (a stopped or cut-off worker) and came back. The report changes nothing; the
    trace says so (`lease_lost`, naming the worker) and the log too. A claim lost any other way
    (a cancel, a deadline, a lost race, a report that already settled it) is not a lost lease."""
    if not refused:
        return
    expired = set(
        TraceEvent.objects.filter(
            run_id=txn.run.pk,
            task_key__in=[c.key for c in refused],
            event="claim_expired",
            data__claim__in=list({c.claim for c in refused}),
        ).values_list("task_key", "data__claim")
    )
    for claimed in refused:
        if (claimed.key, claimed.claim) not in expired:
            continue
        worker = worker_of(claimed.claim)
        txn.event(claimed.key, "lease_lost", data={"worker": worker, "claim": claimed.claim, "attempt": claimed.attempt})
        log.warning(
            "worker %s reported task %s (%s of run %s) after its lease expired: the report was refused",
            worker,
            claimed.task_id,
            claimed.key,
            claimed.run_id,
        )


def merge_result(txn: Txn, task: Task, extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """Fold a worker's report into the task's result; each provider call becomes a trace event."""
    extra = dict(extra or {})
    for call in extra.pop("provider_calls", []):
        txn.event(task.key, "provider_call", data=call)
    return {**(task.result or {}), **extra}


def task_complete(
    claimed: Claimed, value: Any, *, extra: Mapping[str, Any] | None = None, state: Mapping[str, Any] | None = None
) -> bool:
    """The claimant finished the call. False when the claim was lost (a cancel or a sweep won)."""
    with locked(claimed.run_id, "worker") as txn:
        task = held_task(txn, claimed)
        if task is None:
            return False
        if task.kind == "round" and txn.run.status == RunStatus.CANCELING:
            refuse_completion(txn, task, extra, state)
            return False
        fields: dict[str, Any] = {"finished_at": txn.now, "claim": None}
        if state is not None:
            fields["state"] = dict(state)
        txn.complete([(task, value)], result=merge_result(txn, task, extra), **fields)
        release(txn, [task.key])
        return True


COMPLETION_REFUSED = "run_canceling"


def refuse_completion(txn: Txn, task: Task, extra: Mapping[str, Any] | None, state: Mapping[str, Any] | None) -> None:
    """A round of a run being canceled is never `completed` (its answer may rest on a call the
    cancel stopped): the report is refused, typed in the trace, and the round ends canceled like a
    stopped one, keeping what the report carried (usage, stderr) but its value."""
    txn.event(
        task.key,
        "report_refused",
        data={
            "report": "completed",
            "key": COMPLETION_REFUSED,
            "detail": "the run is being canceled: its round is not completed",
        },
    )
    fields: dict[str, Any] = {"result": merge_result(txn, task, extra), "finished_at": txn.now, "claim": None}
    if state is not None:
        fields["state"] = dict(state)
    txn.move(task, TaskStatus.CANCELED, error=("run_canceled", None), **fields)


def task_fail(
    claimed: Claimed,
    error_key: str,
    detail: str | None = None,
    *,
    status: str = TaskStatus.FAILED,
    extra: Mapping[str, Any] | None = None,
    state: Mapping[str, Any] | None = None,
) -> bool:
    """The claimant's call failed with a typed error."""
    with locked(claimed.run_id, "worker") as txn:
        task = held_task(txn, claimed)
        if task is None:
            return False
        fields: dict[str, Any] = {"finished_at": txn.now, "claim": None}
        if extra:
            fields["result"] = merge_result(txn, task, extra)
        if state is not None:
            fields["state"] = dict(state)
        fail_claimed(txn, task, status, error_key, detail, fields)
        return True


WORKER_ERROR_DETAIL_MAX = 2000


def task_errored(claimed: Claimed, error: BaseException) -> bool:
    """The worker met an exception it has no word for while it held the call: the call fails with
    the key `error` (kind `error`) under its own policy, never re-run blind, never left claimed."""
    detail = f"{type(error).__name__}: {error}"[:WORKER_ERROR_DETAIL_MAX]
    with locked(claimed.run_id, "worker") as txn:
        task = held_task(txn, claimed)
        if task is None:
            return False
        txn.move(
            task,
            TaskStatus.FAILED,
            error=("error", detail),
            event_data={"exception": type(error).__name__},
            finished_at=txn.now,
            claim=None,
        )
        after_failure(txn, task)
        return True


def task_stopped(claimed: Claimed, *, extra: Mapping[str, Any] | None = None) -> bool:
    """The claimant stopped because the kernel asked it to (a run cancel); `extra` is what it
    reports on the way out (a harness's usage and stderr), kept on the task's result."""
    with locked(claimed.run_id, "worker") as txn:
        task = held_task(txn, claimed)
        if task is None:
            return False
        fields: dict[str, Any] = {"finished_at": txn.now, "claim": None}
        if extra:
            fields["result"] = merge_result(txn, task, extra)
        txn.move(task, TaskStatus.CANCELED, error=("run_canceled", None), **fields)
        return True


def claim_batch(run_id: Any, task_ids: Sequence[int], claim: str) -> list[Claimed]:
    """Take several queued quick calls of one run in one transaction (those still queued)."""
    with locked(run_id, "worker") as txn:
        return take_queued(txn, task_ids, claim)


def take_queued(txn: Txn, task_ids: Sequence[int], claim: str) -> list[Claimed]:
    """Claim the given quick calls that are still queued, under the transaction's run lock."""
    if txn.run.status not in WORKING_RUN_STATUSES or not task_ids:
        return []
    wanted = set(task_ids)
    unwritten = {t.pk for t in txn.pending_ready}
    cached = {t.pk: t for t in txn.cache.values() if t.pk in wanted}
    if len(cached) == len(wanted) and wanted <= unwritten:
        # Calls this transaction itself made ready are in its cache as they stand (the run lock
        # keeps every other writer out), their readiness not yet written: the claim writes it.
        txn.pending_ready = [t for t in txn.pending_ready if t.pk not in wanted]
        ready = [t for t in cached.values() if t.status == TaskStatus.WAITING and t.ready and t.kind == "tool"]
        tasks = claim_rows(txn, [t for t in ready if approval_holds(txn, t)], claim, queued_now=True)
        # What is not claimed here stays queued: its readiness is written at commit as before.
        taken = {t.pk for t in tasks}
        txn.pending_ready.extend(t for t in cached.values() if t.pk not in taken and t.status == TaskStatus.WAITING and t.ready)
    else:
        # Calls a message named: claimed and read back in one statement, but for the calls a model
        # composed, which pass the approval stage first (their arguments may have changed since).
        txn.flush()
        tasks = claim_named(txn.run.pk, list(wanted), claim, txn.now, tool_deadline({}, txn.now))
        rest = wanted - {t.pk for t in tasks}
        if rest:
            composed = list(Task.objects.filter(pk__in=rest, run=txn.run, status=TaskStatus.WAITING, ready=True, kind="tool"))
            txn.remember(composed)
            tasks += claim_rows(txn, [t for t in composed if approval_holds(txn, t)], claim, queued_now=False)
    if not tasks:
        return []
    tasks.sort(key=lambda t: t.position)
    for task in tasks:
        if task.spec.get("timeout_s"):
            task.deadline_at = tool_deadline(task.spec, txn.now)
            Task.objects.filter(pk=task.pk).update(deadline_at=task.deadline_at)
        txn.event(task.key, "status", TaskStatus.WAITING, TaskStatus.RUNNING)
    # Held by the transaction as running: the run's quiescence check needs no query (settling._busy).
    txn.remember(tasks)
    return [claimed_from(task) for task in tasks]


def claim_rows(txn: Txn, tasks: list[Task], claim: str, *, queued_now: bool) -> list[Task]:
    """Claim queued calls whose rows the transaction holds (read under the run lock): one
    conditional UPDATE, the rows brought in line with it."""
    tasks = [t for t in tasks if t.status == TaskStatus.WAITING and t.ready]
    if not tasks:
        return []
    txn.claim(tasks, claim, tool_deadline({}, txn.now), queued_now=queued_now)
    return tasks


def report_batch(outcomes: Sequence[Outcome], *, take: int = 0, then_claim: str | None = None) -> list[Claimed]:
    """Settle a batch's calls (of one run, under one claim) in one transaction and release their
    consumers once.

    With `then_claim`, up to `take` quick calls this release made ready are claimed under it in
    the same transaction and returned: the reporting worker runs them next itself, so a chain of
    quick calls costs one transaction and no broker round trip per step. They are claimed like
    any chunk (durably, under a lease), so a worker that dies first leaves them to the lease sweep.
    """
    if not outcomes:
        return []
    run_id, claim = outcomes[0].claimed.run_id, outcomes[0].claimed.claim
    if any((o.claimed.run_id, o.claimed.claim) != (run_id, claim) for o in outcomes):
        raise ValueError("a batch reports the calls of one run under one claim")
    with locked(run_id, "worker") as txn:
        if all(o.error is None and not o.stopped for o in outcomes):
            # Every call answered a value (the usual chunk): one statement settles the calls
            # this claim still holds and returns their rows; a call it no longer holds is left alone.
            completed = txn.complete([(o.claimed.task_id, o.value) for o in outcomes], held_by=claim)
            done = {t.pk for t in completed}
            record_lost_lease(txn, [o.claimed for o in outcomes if o.claimed.task_id not in done])
        else:
            completed = settle_mixed(txn, outcomes, claim)
        taking = then_claim is not None and take > 0
        release(txn, [t.key for t in completed], flush=not taking)
        if not taking:
            return []
        taken = txn.dispatch_quick[:take]
        del txn.dispatch_quick[:take]
        assert then_claim is not None
        return take_queued(txn, taken, then_claim)


def settle_mixed(txn: Txn, outcomes: Sequence[Outcome], claim: str) -> list[Task]:
    """Settle a batch whose calls ended in different ways (values, typed errors, stops), each
    under its own policy; returns the completed ones."""
    held = {
        t.pk: t
        for t in Task.objects.filter(
            pk__in=[o.claimed.task_id for o in outcomes], run=txn.run, claim=claim, status=TaskStatus.RUNNING
        )
    }
    txn.remember(held.values())
    record_lost_lease(txn, [o.claimed for o in outcomes if o.claimed.task_id not in held])
    completed: list[Task] = []
    for outcome in outcomes:
        task = held.get(outcome.claimed.task_id)
        if task is None:
            continue
        if outcome.stopped:
            txn.move(task, TaskStatus.CANCELED, error=("run_canceled", None), finished_at=txn.now, claim=None)
        elif outcome.error is not None:
            key, detail = outcome.error
            fail_claimed(txn, task, TaskStatus.FAILED, key, detail, {"finished_at": txn.now, "claim": None})
        else:
            # A mixed batch is rare (the usual chunk answers every call, one statement in
            # report_batch): each completion is written in the batch's order, as its row.
            completed += txn.complete([(task, outcome.value)], finished_at=txn.now, claim=None)
    return completed
