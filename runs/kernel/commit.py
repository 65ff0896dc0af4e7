"""The unit of work: a kernel transaction on one run opened (`locked`) and committed (`commit`).

A `Txn` (runs.kernel.txn) records what the transaction changes and calls nothing above its own
layer. This module sits above every layer a commit needs and runs the steps in one fixed order:

1. write the pending bulk moves (readiness, skips);
2. the run-level steps the moves made due, each once (runs.kernel.settling: `wake_parked`,
   `settle_run`, `restamp_run`, `announce_asks`), which may change the run row and add trace events;
3. the child runs the transaction opened (runs.kernel.children): their tasks added and each
   child's own transaction committed, before the parent's trace as when they were opened;
4. insert the trace events, THEN save the run row: the insights trigger on the trace insert
   (insights_count_repairs) reads `runs_run.held_since` when a retry or abandon's `resolved`
   event lands, and the same transaction's release of the hold clears it; saved first, the run
   row would tell the trigger the repair was never held (tests/runs/test_kernel_txn.py);
5. register with `transaction.on_commit`, so nothing leaves the process for a change that rolled
   back: the Celery sends (through the installed `Sender`), the channel publish, and the messages
   to other runs (runs.kernel.delegation), each delivered in a transaction of its own.

The one thing installed rather than imported is the `Sender`: the kernel never imports Celery or
the worker, so the runs app's `AppConfig.ready()` (the composition root, the outermost boundary)
installs the Celery adapter, and tests and the demo swap it for their own.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.models import QuerySet
from django.utils import timezone
from psycopg.errors import LockNotAvailable

from oz0site import realtime
from runs.kernel.bulk import insert_trace, lock_run
from runs.kernel.delegation import (
    cancel_as_child,
    ended_child,
    pause_as_child,
    resume_as_child,
    settle_delegate,
)
from runs.kernel.errors import NotFound
from runs.kernel.expansion import add_tasks
from runs.kernel.priorities import DEFAULT as DEFAULT_PRIORITY
from runs.kernel.settling import announce_asks, restamp_run, settle_run, wake_parked
from runs.kernel.txn import RUN_STEPS, CrossRun, Txn
from runs.models import Run, Task

log = logging.getLogger(__name__)

T = TypeVar("T")


class Sender(Protocol):
    """Sends ready work to the workers: one message per task id, one per chunk of quick calls, and
    one per session (a round of an agent written in a framework, F7), which goes to the session
    workers: a session waits on people and tool calls for as long as they take, and must not hold
    a slot the engine's own rounds, tools and sweeps need."""

    def __call__(
        self, task_ids: list[int], chunks: list[list[int]], run_id: str | None, sessions: list[int], priority: int = ...
    ) -> None: ...


# The port to the broker, installed at start-up by the runs app (see the module docstring).
_sender: Sender | None = None


def install_sender(sender: Sender | None) -> Sender | None:
    """Install the port the kernel sends through (the runs app's Celery adapter); returns the one before."""
    global _sender
    previous, _sender = _sender, sender
    return previous


class RunBusy(Exception):
    """Another transaction held the run's row lock for longer than the caller would wait."""


@contextmanager
def locked(run_id: Any, actor: str = "", *, wait: float | None = None) -> Iterator[Txn]:
    """A transaction holding the run's row lock; what it records is committed at the end.

    `wait` (the sweeps): wait at most that many seconds for the lock, then raise RunBusy. One
    sweeper serves every workspace, and a neighbour's long transaction on its own run (a large
    append), or a holder gone quiet, must not hold up everyone else's expired claims and clocks;
    the next pass comes back to the busy run. A bounded wait, not a skip: a busy run's many short
    transactions (a fan's reports) are each waited out, so the sweep still gets its turn there."""
    try:
        key = run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id))
    except (ValueError, TypeError):
        raise NotFound("run") from None
    with transaction.atomic():
        run = lock_run(key) if wait is None else _lock_run_within(key, wait)
        if run is None:
            raise NotFound("run")
        txn = Txn(run=run, actor=actor)
        yield txn
        commit(txn)


def sweep_each(items: Iterable[tuple[Any, T]], actor: str, act: Callable[[Txn, T], bool]) -> int:
    """A sweep's work on each item, in its run's locked transaction: the lock waited for at most
    half the sweeper's period, and a run still busy then passed over until the next pass (see
    `locked`). Returns how many items `act` acted on."""
    wait = float(settings.OZ0_SWEEP_SECONDS) / 2
    acted = 0
    for run_id, item in items:
        try:
            with locked(run_id, actor, wait=wait) as txn:
                acted += act(txn, item)
        except RunBusy:
            continue
    return acted


def sweep_stale_holders(
    stale: QuerySet[Task], act: Callable[[Txn, Task], None], *, first: Callable[[list[str | None]], object] | None = None
) -> int:
    """A lease sweep: each task `stale` selects (a holder that stopped heartbeating), judged again
    in its run's locked transaction, with the same filter and the claim it had when listed (a
    holder that heartbeated, or a claim that changed hands, meanwhile is left alone), is handed to
    `act`. `first` is given the listed claims before any is acted on. Returns how many were."""
    listed = list(stale.values_list("pk", "run_id", "claim"))
    if listed and first is not None:
        first([claim for _, _, claim in listed])

    def still_stale(txn: Txn, task_and_claim: tuple[int, str | None]) -> bool:
        task_id, claim = task_and_claim
        task = stale.filter(pk=task_id, claim=claim).first()
        if task is None:
            return False
        txn.remember([task])
        act(txn, task)
        return True

    return sweep_each(((run_id, (task_id, claim)) for task_id, run_id, claim in listed), "sweep", still_stale)


def _lock_run_within(key: uuid.UUID, seconds: float) -> Run | None:
    with connection.cursor() as cursor:
        # The setting as it was, read before it is changed (a select list is evaluated in order).
        cursor.execute(
            "SELECT current_setting('lock_timeout'), set_config('lock_timeout', %s, true)", [f"{max(1, round(seconds * 1000))}ms"]
        )
        before = cursor.fetchone()[0]
        try:
            run = lock_run(key)
        except OperationalError as error:  # the transaction is rolled back on its way out
            if isinstance(error.__cause__, LockNotAvailable):
                raise RunBusy(key) from None
            raise
        # What this transaction does next waits as long as any other would.
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [before])
    return run


def commit(txn: Txn) -> None:
    """Write what the transaction recorded and register its side effects, in the order above."""
    txn.flush()
    for step in RUN_STEPS:
        if step in txn.due:
            run_step(step, txn)
    for child in txn.children:
        add_tasks(child.txn, child.tasks)
        child.txn.check_run()
        commit(child.txn)
    write_trace_then_run(txn)
    if txn.dispatch or txn.dispatch_quick or txn.dispatch_sessions:
        send_on_commit(txn.dispatch, txn.run.pk, txn.dispatch_quick, txn.dispatch_sessions, priority=txn.run.priority)
    if txn.changed:
        publish_on_commit(txn)
    for message, run_id in txn.cross_run:
        transaction.on_commit(lambda message=message, run_id=run_id: deliver(message, run_id))  # type: ignore[misc]


def run_step(step: str, txn: Txn) -> None:
    if step == "wake_parked":
        wake_parked(txn)
    elif step == "settle_run":
        settle_run(txn)
    elif step == "restamp":
        restamp_run(txn)
    elif step == "announce":
        announce_asks(txn)
    else:
        raise AssertionError(f"no run step {step!r}")


def write_trace_then_run(txn: Txn) -> None:
    """Trace events first, the run row second: the repairs trigger on the trace insert reads
    the run row as it stood before this transaction (its held_since; see the module docstring)."""
    run = txn.run
    if txn.run_fields == {"last_seq"} and txn.events:
        # The usual transaction: one statement writes its trace and the run's new sequence.
        run.updated_at = timezone.now()
        insert_trace(run.pk, txn.events, run_seq=(run.last_seq, run.updated_at))
        return
    insert_trace(run.pk, txn.events)
    if txn.run_fields:
        run.save(update_fields=[*sorted(txn.run_fields), "updated_at"])


def publish_on_commit(txn: Txn) -> None:
    run = txn.run
    payload = {
        "type": "run.changed",
        "run": str(run.id),
        "workspace": run.workspace_id,
        "status": run.status,
        "seq": run.last_seq,
        "attention": (run.attention or {}).get("reason"),
        "tasks": sorted({e.task_key for e in txn.events if e.task_key})[:50],
    }
    realtime.publish_on_commit([realtime.run_group(run.id), realtime.workspace_group(run.workspace_id)], payload)


def send_on_commit(
    task_ids: Sequence[int],
    run_id: Any = None,
    quick: Sequence[int] = (),
    sessions: Sequence[int] = (),
    *,
    priority: int = DEFAULT_PRIORITY,
) -> None:
    """Send these tasks to the workers once the surrounding transaction commits, with their run's
    priority (runs.kernel.priorities)."""
    in_sessions = list(dict.fromkeys(sessions))
    singles = [i for i in dict.fromkeys(task_ids) if i not in set(in_sessions)]
    sent_alone = set(singles) | set(in_sessions)
    chunks = quick_chunks([i for i in dict.fromkeys(quick) if i not in sent_alone])
    run = str(run_id) if run_id is not None else None

    def send() -> None:
        if _sender is None:
            raise RuntimeError("no sender is installed: the runs app installs one in AppConfig.ready()")
        try:
            _sender(singles, chunks, run, in_sessions, priority=priority)
        except Exception as error:
            # The change is committed; a broker that is away must not turn it into an error for
            # whoever made it (a request would answer 500 for a run that exists). The tasks stay
            # queued in the database and the lost-message sweep sends them again.
            log.warning(
                "sending %d ready tasks of run %s failed (%s); the lost-message sweep sends them again",
                len(singles) + sum(map(len, chunks)) + len(in_sessions),
                run,
                error,
            )

    transaction.on_commit(send)


def quick_chunks(ids: list[int]) -> list[list[int]]:
    """Split ready quick calls into one message per chunk: a chunk is claimed, run and reported in
    two transactions, yet there are enough chunks for every worker process to take a share."""
    if not ids:
        return []
    size = max(1, int(settings.OZ0_QUICK_BATCH))
    parts = max(1, int(settings.OZ0_QUICK_SPREAD))
    size = max(1, min(size, -(-len(ids) // parts)))
    return [ids[i : i + size] for i in range(0, len(ids), size)]


# ---- messages between two runs, each delivered in a transaction of its own on the other run ----


def deliver(message: CrossRun, run_id: str) -> None:
    """Deliver one cross-run message. A failure is logged: the delegation sweep delivers it again."""
    try:
        if message == "settle_parent":
            settle_parent(run_id)
        elif message == "cancel_child":
            cancel_child(run_id)
        elif message == "pause_child":
            pause_child(run_id)
        elif message == "resume_child":
            resume_child(run_id)
        else:
            raise AssertionError(f"no cross-run message {message!r}")
    except Exception:
        log.exception("cross-run %s of run %s failed; the delegation sweep sends it again", message, run_id)


def settle_parent(child_id: str) -> bool:
    """A child run ended: settle its parent's delegate task (after the child's commit, under the
    parent's lock). False when there is nothing to settle (already settled, or not a child)."""
    child = ended_child(child_id)
    if child is None:
        return False
    with locked(child["parent_id"], "delegation") as txn:
        return settle_delegate(txn, child)


def cancel_child(child_id: str) -> bool:
    """The parent stopped (or its delegate task did): cancel the child (runs.kernel.delegation)."""
    with locked(child_id, "parent") as txn:
        return cancel_as_child(txn)


def pause_child(child_id: str) -> bool:
    """The parent paused: pause the child if it is running."""
    with locked(child_id, "parent") as txn:
        return pause_as_child(txn)


def resume_child(child_id: str) -> bool:
    """The parent resumed: resume the child if the parent's pause is what paused it."""
    with locked(child_id, "parent") as txn:
        return resume_as_child(txn)
