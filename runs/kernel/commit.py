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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from django.conf import settings
from django.db import transaction
from django.utils import timezone

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

log = logging.getLogger(__name__)


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


@contextmanager
def locked(run_id: Any, actor: str = "") -> Iterator[Txn]:
    """A transaction holding the run's row lock; what it records is committed at the end."""
    try:
        key = run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id))
    except (ValueError, TypeError):
        raise NotFound("run") from None
    with transaction.atomic():
        run = lock_run(key)
        if run is None:
            raise NotFound("run")
        txn = Txn(run=run, actor=actor)
        yield txn
        commit(txn)


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
