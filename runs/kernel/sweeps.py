"""Sweeps and clocks, run by Celery beat: expired claims, lost messages (to workers and between
runs), park clocks and await timeouts.

Holds have no clock (S19): nothing here touches a run that waits on a person's decision.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Exists, Min, OuterRef, Q
from django.utils import timezone

from runs.kernel.commit import (
    cancel_child,
    pause_child,
    resume_child,
    send_on_commit,
    settle_parent,
    sweep_each,
    sweep_stale_holders,
)
from runs.kernel.failure import is_replayable, nonreplayable_calls
from runs.kernel.graph import FINISHED_RUN_STATUSES, KERNEL_EXECUTED, OPEN_RUN_STATUSES
from runs.kernel.holder_sessions import end_frozen_holder_sessions
from runs.kernel.scheduling import after_failure, make_ready
from runs.kernel.settling import PAUSABLE
from runs.kernel.txn import Txn
from runs.models import Run, RunStatus, Task, TaskStatus

# A replayable call whose claim expired this many times in a row fails instead of being handed on.
MAX_EXPIRED_CLAIMS = 3


def sweep_expired_claims(now: datetime | None = None, *, grace: float = 0.0) -> int:
    """A running call whose claimant stopped heartbeating: a replayable one is queued again,
    a non-replayable one becomes `uncertain` for a person to decide (S10).

    `grace`: seconds added to the lease, given by a sweeper that could not see the database for
    that long (an outage: no holder could heartbeat either), so a live holder is not taken for dead
    before it has had a whole lease to heartbeat again."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=float(settings.OZ0_LEASE_SECONDS) + max(0.0, grace))
    # The longest silent first: when many holders stop at once (a worker's whole pool), the last
    # one handed on is the one whose lease ran out last.
    stale = Task.objects.filter(status=TaskStatus.RUNNING, heartbeat_at__lt=cutoff).order_by("heartbeat_at", "pk")
    # A holder frozen inside a transaction would keep the locks its hand-on needs: its sessions
    # idle in one for a heartbeat are ended first (runs/kernel/holder_sessions.py).
    return sweep_stale_holders(
        stale, _expire_claim, first=lambda claims: end_frozen_holder_sessions(claims, idle_seconds=settings.OZ0_HEARTBEAT_SECONDS)
    )


def seconds_to_next_claim_expiry(now: datetime | None = None, *, grace: float = 0.0) -> float | None:
    """How long until the next held call's lease runs out, by the claims sweep's own measure (the
    same lease and grace), so the sweeper can wake for it instead of up to a period later. None
    when no call is held on a lease that is still running (those past it are the sweep's now)."""
    now = now or timezone.now()
    lease = float(settings.OZ0_LEASE_SECONDS) + max(0.0, grace)
    cutoff = now - timedelta(seconds=lease)
    earliest = Task.objects.filter(status=TaskStatus.RUNNING, heartbeat_at__gte=cutoff).aggregate(earliest=Min("heartbeat_at"))[
        "earliest"
    ]
    return None if earliest is None else (earliest - cutoff).total_seconds()


def _expire_claim(txn: Txn, task: Task) -> None:
    if txn.run.status == RunStatus.CANCELING or task.cancel_requested:
        txn.move(task, TaskStatus.CANCELED, error=("run_canceled", "the worker stopped"), claim=None, finished_at=txn.now)
        return
    replayable = is_replayable(task)
    expired = int(task.state.get("expired_claims", 0)) + 1
    state = {**task.state, "expired_claims": expired}
    # When its holder last proved itself alive: how late the sweep acted is read off the trace.
    seen = {"claim": task.claim, "heartbeat_at": task.heartbeat_at.isoformat() if task.heartbeat_at else None}
    if replayable and expired >= MAX_EXPIRED_CLAIMS:
        # Its workers keep dying during this call (a crash, an out-of-memory kill): handing it on
        # again would loop forever, so it fails for a person to look at.
        txn.event(task.key, "claim_expired", data={**seen, "replayed": False, "expired": expired})
        txn.move(
            task,
            TaskStatus.FAILED,
            error=("error", f"the worker stopped during this call {expired} times"),
            claim=None,
            finished_at=txn.now,
            deadline_at=None,
            state=state,
        )
        after_failure(txn, task)
    elif replayable:
        txn.event(task.key, "claim_expired", data={**seen, "replayed": True, "expired": expired})
        txn.move(task, TaskStatus.WAITING, claim=None, ready=False, deadline_at=None, state=state)
        make_ready(txn, task)
    else:
        error = ("tool_uncertain", "the worker stopped during a non-replayable call")
        data: dict[str, Any] = {**seen, "replayed": False}
        if task.kind == "round":
            # A harnessed session that made non-replayable calls: started over it would make them again.
            made = nonreplayable_calls(task)
            data["nonreplayable_calls"] = made
            # Each with its status: one still in a person's hands has not run (yet), and says so.
            listed = ", ".join(f"{c['key']} ({c['tool']}, {c['status']})" for c in made)
            error = ("round_uncertain", f"the session worker stopped after the round made non-replayable calls: {listed}")
        txn.event(task.key, "claim_expired", data=data)
        txn.move(task, TaskStatus.UNCERTAIN, error=error, claim=None, finished_at=txn.now)
        after_failure(txn, task)


def sweep_lost_messages(now: datetime | None = None, *, broker_queue_empty: bool = True) -> int:
    """Queued tasks whose message never reached a worker (a broker restart) are sent again.

    Only when the broker's queues (the workers' and the sessions') are empty: then nothing queued
    can still be on its way.
    The claim is conditional, so a duplicate message is harmless anyway.
    """
    if not broker_queue_empty:
        return 0
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=float(settings.OZ0_REQUEUE_SECONDS))
    rows = list(
        Task.objects.filter(status=TaskStatus.WAITING, ready=True, queued_at__lt=cutoff, kind__in=KERNEL_EXECUTED)
        .exclude(run__status=RunStatus.PAUSED)
        .order_by("-run__priority", "pk")  # the highest priority first (runs.kernel.priorities)
        .values_list("pk", "run__priority")[:1000]
    )
    lost = [pk for pk, _ in rows]
    if lost:
        Task.objects.filter(pk__in=lost).update(queued_at=now)
        sessions = set(
            Task.objects.filter(pk__in=lost, kind="round", run__agent_version__manifest__harness__has_key="kind").values_list(
                "pk", flat=True
            )
        )
        by_priority: dict[int, list[int]] = {}
        for pk, priority in rows:
            by_priority.setdefault(priority, []).append(pk)
        for priority, ids in by_priority.items():  # highest first: the rows' order
            send_on_commit(ids, sessions=[i for i in ids if i in sessions], priority=priority)
    return len(lost)


CLOCKED = (TaskStatus.NEEDS_APPROVAL, TaskStatus.AWAITING_INPUT, TaskStatus.DISPATCHED, TaskStatus.RUNNING)


def sweep_clocks(now: datetime | None = None) -> int:
    """Park clocks, await timeouts, tool deadlines and harnessed rounds' deadlines: each ends its
    task `timed_out` under its own policy. A tool call past its deadline is told to stop; whatever its holder reports later finds
    the claim gone."""
    now = now or timezone.now()
    due = list(Task.objects.filter(deadline_at__lte=now, status__in=CLOCKED).values_list("pk", "run_id"))
    return sweep_each(
        ((run_id, task_id) for task_id, run_id in due), "clock", lambda txn, task_id: _end_on_its_clock(txn, task_id, now)
    )


def _end_on_its_clock(txn: Txn, task_id: int, now: datetime) -> bool:
    txn.now = now
    task = Task.objects.filter(pk=task_id, deadline_at__lte=now).first()
    if task is None or task.status not in CLOCKED:
        return False
    txn.remember([task])
    running_tool = task.kind == "tool" and task.status in (TaskStatus.RUNNING, TaskStatus.DISPATCHED)
    # A harnessed round whose worker did not end it at its deadline (stuck, or cut off): told to
    # stop, its report refused; never re-run blind (a hung agent would hang again).
    running_round = task.kind == "round" and task.status == TaskStatus.RUNNING
    if running_tool or running_round:
        key, detail = (
            ("tool_timeout", "the call ran past its deadline")
            if running_tool
            else ("round_timeout", "the round ran past its deadline and its worker did not end it")
        )
        Task.objects.filter(pk=task.pk).update(cancel_requested=True)
        task.cancel_requested = True
        txn.move(task, TaskStatus.TIMED_OUT, error=(key, detail), finished_at=now, deadline_at=None, claim=None)
    elif task.status == TaskStatus.NEEDS_APPROVAL:
        key, detail = "approval_expired", "nobody decided before the park clock ran out"
        txn.move(task, TaskStatus.TIMED_OUT, error=(key, detail), finished_at=now, deadline_at=None)
    elif task.kind == "await":
        key, detail = "await_timeout", "nobody answered in time"
        txn.move(task, TaskStatus.TIMED_OUT, error=(key, detail), finished_at=now, deadline_at=None)
    else:
        return False
    after_failure(txn, task)
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
