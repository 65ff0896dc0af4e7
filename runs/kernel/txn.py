"""The unit of work: one kernel transaction on one run, holding the run's row lock.

`locked(run_id)` opens it; a `Txn` changes task rows compare-and-set on their current status
(`move`, `move_many`), traces every change, and at the end (`finish`) runs the commit steps in
one fixed order:

1. write the pending bulk moves (readiness, skips);
2. the run-level steps the moves made due (`settle_run`, `restamp`, `announce`, installed by
   `runs.kernel.settling`), which may change the run row and add trace events;
3. insert the trace events, THEN save the run row: the insights trigger on the trace insert
   (insights_count_repairs) reads `runs_run.held_since` when a retry or abandon's `resolved`
   event lands, and the same transaction's release of the hold clears it; saved first, the run
   row would tell the trigger the repair was never held (tests/runs/test_kernel_txn.py);
4. register the Celery sends (through the installed `Sender`) and the channel publish with
   `transaction.on_commit`, so nothing leaves the process for a change that rolled back.

The kernel does not import Celery: the runs app installs the sender in `AppConfig.ready()`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from oz0site import realtime
from runs.kernel.bulk import PendingEvent, insert_trace, lock_run, mark_ready, skip_waiting
from runs.kernel.errors import Conflict, NotFound
from runs.kernel.graph import ASKING_STATUSES, FAILED_STATUSES, FINISHED_RUN_STATUSES
from runs.models import Run, Task, TaskStatus

log = logging.getLogger(__name__)

# The run-level steps a transaction runs before it writes, in this order.
RunStep = Literal["settle_run", "restamp", "announce"]
RUN_STEPS: tuple[RunStep, ...] = ("settle_run", "restamp", "announce")


class Sender(Protocol):
    """Sends ready work to the workers: one message per task id, one per chunk of quick calls, and
    one per session (a round of an agent written in a framework, F7), which goes to the session
    workers: a session waits on people and tool calls for as long as they take, and must not hold
    a slot the engine's own rounds, tools and sweeps need."""

    def __call__(self, task_ids: list[int], chunks: list[list[int]], run_id: str | None, sessions: list[int]) -> None: ...


_sender: Sender | None = None
_run_steps: dict[RunStep, Callable[[Txn], None]] = {}

# Delegation's messages between two runs (F14-F16). A transaction never holds two runs' locks:
# what one run's change means to another (a child ended: settle the parent's task; a parent is
# canceled: cancel the child) is done after commit, in a transaction of its own on the other run.
# Each is idempotent, and the delegation sweep sends again whatever a crash lost.
CrossRun = Literal["settle_parent", "cancel_child", "pause_child", "resume_child"]
_cross_run: dict[CrossRun, Callable[[str], object]] = {}
_child_starter: list[Callable[[Txn, Task], None]] = []


def install_sender(sender: Sender | None) -> Sender | None:
    """Install the port the kernel sends through (the runs app's Celery adapter); returns the one before."""
    global _sender
    previous, _sender = _sender, sender
    return previous


def install_run_step(name: RunStep, step: Callable[[Txn], None]) -> None:
    """Install one of the run-level commit steps (runs.kernel.settling does, on import)."""
    _run_steps[name] = step


def install_cross_run(name: CrossRun, handler: Callable[[str], object]) -> None:
    """Install what a cross-run message does (runs.kernel.delegation does, on import)."""
    _cross_run[name] = handler


def install_child_starter(starter: Callable[[Txn, Task], None]) -> None:
    """Install how a ready delegate task starts its child run (runs.kernel.delegation does)."""
    _child_starter[:] = [starter]


def cross_run_now(name: CrossRun, run_id: str) -> None:
    """Deliver one cross-run message. A failure is logged: the delegation sweep delivers it again."""
    try:
        _cross_run[name](run_id)
    except Exception:
        log.exception("cross-run %s of run %s failed; the delegation sweep sends it again", name, run_id)


def send_on_commit(task_ids: Sequence[int], run_id: Any = None, quick: Sequence[int] = (), sessions: Sequence[int] = ()) -> None:
    """Send these tasks to the workers once the surrounding transaction commits."""
    in_sessions = list(dict.fromkeys(sessions))
    singles = [i for i in dict.fromkeys(task_ids) if i not in set(in_sessions)]
    sent_alone = set(singles) | set(in_sessions)
    chunks = quick_chunks([i for i in dict.fromkeys(quick) if i not in sent_alone])
    run = str(run_id) if run_id is not None else None

    def send() -> None:
        if _sender is None:
            raise RuntimeError("no sender is installed: the runs app installs one in AppConfig.ready()")
        try:
            _sender(singles, chunks, run, in_sessions)
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


def error_of(error: tuple[str, str | None] | None) -> dict[str, Any] | None:
    return {"key": error[0], "detail": error[1]} if error else None


@dataclass
class Txn:
    """One kernel transaction on one run, holding the run's row lock."""

    run: Run
    actor: str
    now: datetime = field(default_factory=timezone.now)
    events: list[PendingEvent] = field(default_factory=list)
    dispatch: list[int] = field(default_factory=list)
    # Ready calls of quick tools (see runs.tools.Tool.quick): sent to workers in chunks.
    dispatch_quick: list[int] = field(default_factory=list)
    # Ready rounds of an agent written in a framework (F7): sent to the session workers.
    dispatch_sessions: list[int] = field(default_factory=list)
    harnessed: bool | None = None
    cache: dict[str, Task] = field(default_factory=dict)
    changed: bool = False
    # The run-level steps the moves so far have made due (see RUN_STEPS).
    due: set[RunStep] = field(default_factory=set)
    run_fields: set[str] = field(default_factory=set)
    finding_step: Task | None = None
    # Write-behind for the two moves a release makes in bulk (readiness and skips): one
    # UPDATE per transaction instead of one per task. Flushed before anything reads them.
    pending_ready: list[Task] = field(default_factory=list)
    pending_skips: dict[str, list[Task]] = field(default_factory=dict)
    # Waiting consumers known per source key, and the keys whose consumers are all known.
    consumers: dict[str, dict[str, None]] = field(default_factory=dict)
    expanded: set[str] = field(default_factory=set)
    # Messages to other runs, delivered after commit (see CrossRun).
    cross_run: list[tuple[CrossRun, str]] = field(default_factory=list)

    # ---- the run-level steps at commit ----
    def check_run(self) -> None:
        """Judge the run's quiescence at commit (complete, hold, release a hold, finish a cancel)."""
        self.due.add("settle_run")

    def restamp(self) -> None:
        """Bring run.attention in line with the live asks and pending failures at commit."""
        self.due.add("restamp")

    def announce(self) -> None:
        """Bring run.announcements in line with the model-composed asks at commit."""
        self.due.add("announce")

    def runs_a_harness(self) -> bool:
        """Whether the run's agent is written in a framework (F7): its rounds are sessions."""
        if self.harnessed is None:
            self.harnessed = (
                self.run.agent_version_id is not None
                and Run.objects.filter(pk=self.run.pk, agent_version__manifest__harness__has_key="kind").exists()
            )
        return self.harnessed

    def skip_check_run(self) -> None:
        """Taking queued work cannot make a run quiescent: spare the settle queries."""
        self.due.discard("settle_run")

    # ---- trace ----
    def event(
        self,
        task_key: str | None,
        event: str,
        from_status: str | None = None,
        to_status: str | None = None,
        *,
        error: dict[str, Any] | None = None,
        data: dict[str, Any] | None = None,
        actor: str | None = None,
    ) -> None:
        self.run.last_seq += 1
        self.run_fields.add("last_seq")
        self.changed = True
        self.events.append(
            PendingEvent(
                self.run.last_seq, task_key, event, from_status, to_status, error, self.actor if actor is None else actor, data
            )
        )

    # ---- run ----
    def set_run(self, **fields: Any) -> None:
        for name, value in fields.items():
            setattr(self.run, name, value)
            self.run_fields.add(name)
        self.changed = True

    def move_run(self, to: str, **fields: Any) -> None:
        before = self.run.status
        if before == to:
            return
        self.set_run(status=to, **fields)
        self.event(None, "run_status", before, to)
        if to in FINISHED_RUN_STATUSES and self.run.parent_id is not None:
            # A child's end is its parent's news: the parent's delegate task settles after commit.
            self.tell("settle_parent", str(self.run.pk))

    # ---- other runs ----
    def tell(self, name: CrossRun, run_id: str) -> None:
        """Send another run a message after this transaction commits."""
        if (name, run_id) not in self.cross_run:
            self.cross_run.append((name, run_id))

    def start_child(self, task: Task) -> None:
        """Start a ready delegate task's child run (runs.kernel.delegation installs how)."""
        if not _child_starter:
            raise RuntimeError("runs.kernel.delegation is not imported: no child starter is installed")
        _child_starter[0](self, task)

    def stop_child(self, task: Task) -> None:
        """A delegate task that stops takes its running child with it (F16), after commit."""
        if task.kind == "delegate" and task.child_id is not None:
            self.tell("cancel_child", str(task.child_id))

    # ---- tasks ----
    def remember(self, tasks: Iterable[Task]) -> None:
        for task in tasks:
            self.cache[task.key] = task

    def move(
        self,
        task: Task,
        to: str,
        *,
        error: tuple[str, str | None] | None = None,
        event_data: dict[str, Any] | None = None,
        **fields: Any,
    ) -> None:
        """Compare-and-set one task's status and trace it."""
        before = task.status
        values: dict[str, Any] = {"status": to, **fields}
        if error is not None:
            values["error_key"], values["error_detail"] = error
        if to in FAILED_STATUSES:
            # A new failure is unresolved, whatever settled the one before it.
            values.setdefault("failure_resolution", None)
        updated = Task.objects.filter(pk=task.pk, status=before).update(**values)
        if updated != 1:
            raise Conflict("stale_task", f"task {task.key!r} is no longer {before}")
        for name, value in values.items():
            setattr(task, name, value)
        self.cache[task.key] = task
        self.event(task.key, "status", before, to, error=error_of(error), data=event_data)
        self.check_run()
        if to in ASKING_STATUSES or before in ASKING_STATUSES:
            self.announce()
            self.restamp()
        if to in FAILED_STATUSES or before in FAILED_STATUSES:
            self.restamp()

    def move_many(self, tasks: Sequence[Task], to: str, *, error: tuple[str, str | None] | None = None, **fields: Any) -> None:
        """The same transition for many tasks at once (skips and cancels over large graphs)."""
        by_status: dict[str, list[Task]] = {}
        for task in tasks:
            by_status.setdefault(task.status, []).append(task)
        values: dict[str, Any] = {"status": to, **fields}
        if error is not None:
            values["error_key"], values["error_detail"] = error
        if to in FAILED_STATUSES:
            values.setdefault("failure_resolution", None)
        for before, group in by_status.items():
            ids = [t.pk for t in group]
            updated = Task.objects.filter(pk__in=ids, status=before).update(**values)
            if updated != len(ids):
                raise Conflict("stale_task", "tasks changed under the run lock")
            for task in group:
                for name, value in values.items():
                    setattr(task, name, value)
                self.cache[task.key] = task
                self.event(task.key, "status", before, to, error=error_of(error))
            if before in ASKING_STATUSES:
                self.announce()
                self.restamp()
        self.check_run()

    def resolve(self, task: Task, resolution: str | None, **data: Any) -> None:
        Task.objects.filter(pk=task.pk).update(failure_resolution=resolution)
        task.failure_resolution = resolution
        self.cache[task.key] = task
        self.event(task.key, "resolved", data={"resolution": resolution, **data})
        self.restamp()
        self.check_run()

    def tasks_by_key(self, keys: Iterable[str]) -> dict[str, Task]:
        wanted = set(keys)
        missing = [k for k in wanted if k not in self.cache]
        if missing:
            self.remember(Task.objects.filter(run=self.run, key__in=missing))
        return {k: self.cache[k] for k in wanted if k in self.cache}

    def defer_skip(self, task: Task, cause: str) -> None:
        self.event(task.key, "status", task.status, TaskStatus.SKIPPED)
        task.status = TaskStatus.SKIPPED
        task.skipped_by = cause
        task.finished_at = self.now
        self.cache[task.key] = task
        self.pending_skips.setdefault(cause, []).append(task)
        self.check_run()

    def flush(self) -> None:
        if self.pending_ready:
            mark_ready([t.pk for t in self.pending_ready if t.status == TaskStatus.WAITING], self.now)
            self.pending_ready = []
        for cause, group in self.pending_skips.items():
            if skip_waiting([t.pk for t in group], cause, self.now) != len(group):
                raise Conflict("stale_task", "tasks changed under the run lock")
        self.pending_skips = {}

    # ---- commit ----
    def finish(self) -> None:
        self.flush()
        for name in RUN_STEPS:
            if name in self.due:
                _run_steps[name](self)
        self.write_trace_then_run()
        if self.dispatch or self.dispatch_quick or self.dispatch_sessions:
            send_on_commit(self.dispatch, self.run.pk, self.dispatch_quick, self.dispatch_sessions)
        if self.changed:
            self.publish_on_commit()
        for message, run_id in self.cross_run:
            transaction.on_commit(lambda message=message, run_id=run_id: cross_run_now(message, run_id))  # type: ignore[misc]

    def write_trace_then_run(self) -> None:
        """Trace events first, the run row second: the repairs trigger on the trace insert reads
        the run row as it stood before this transaction (its held_since; see the module docstring)."""
        if self.run_fields == {"last_seq"} and self.events:
            # The usual transaction: one statement writes its trace and the run's new sequence.
            self.run.updated_at = timezone.now()
            insert_trace(self.run.pk, self.events, run_seq=(self.run.last_seq, self.run.updated_at))
            return
        insert_trace(self.run.pk, self.events)
        if self.run_fields:
            self.run.save(update_fields=[*sorted(self.run_fields), "updated_at"])

    def publish_on_commit(self) -> None:
        run = self.run
        payload = {
            "type": "run.changed",
            "run": str(run.id),
            "workspace": run.workspace_id,
            "status": run.status,
            "seq": run.last_seq,
            "attention": (run.attention or {}).get("reason"),
            "tasks": sorted({e.task_key for e in self.events if e.task_key})[:50],
        }
        realtime.publish_on_commit([realtime.run_group(run.id), realtime.workspace_group(run.workspace_id)], payload)


@contextmanager
def locked(run_id: Any, actor: str = "") -> Iterator[Txn]:
    """A transaction holding the run's row lock; its moves are written and published at the end."""
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
        txn.finish()
