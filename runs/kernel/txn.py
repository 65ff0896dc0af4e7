"""What one kernel transaction on one run changes, recorded: the low layer of the unit of work.

A `Txn` changes task rows compare-and-set on their current status (`move`, `move_many`, and
`complete`, the one way a task completes), and records everything else the transaction means:
its trace events, the run row's changed fields, the run-level steps its moves made due
(`RUN_STEPS`), the ready work to send, the children it opened and the messages to other runs.
It calls no layer above its own: `runs.kernel.commit` (which imports every layer it needs, and
opens transactions with `locked()`) reads the record and commits it, in one fixed order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from django.utils import timezone

from runs.kernel.bulk import PendingEvent, claim_queued, complete_held, mark_ready, skip_waiting
from runs.kernel.compile import TaskSpec
from runs.kernel.errors import Conflict
from runs.kernel.graph import ASKING_STATUSES, FAILED_STATUSES, FINISHED_RUN_STATUSES
from runs.models import Run, Task, TaskStatus

# The run-level steps a transaction runs before it writes, in this order.
RunStep = Literal["wake_parked", "settle_run", "restamp", "announce"]
# Parked sessions are woken first: a round made ready keeps the run busy when its quiescence is judged.
RUN_STEPS: tuple[RunStep, ...] = ("wake_parked", "settle_run", "restamp", "announce")


# Delegation's messages between two runs (F14-F16). A transaction never holds two runs' locks:
# what one run's change means to another (a child ended: settle the parent's task; a parent is
# canceled: cancel the child) is recorded here (`Txn.tell`) and delivered after commit by
# runs.kernel.commit, in a transaction of its own on the other run. Each is idempotent, and the
# delegation sweep sends again whatever a crash lost.
CrossRun = Literal["settle_parent", "cancel_child", "pause_child", "resume_child"]


@dataclass
class OpenedChild:
    """A child run a ready delegate task opened in this transaction: its row is written; its tasks
    are added, and its own transaction committed, when the parent's commits (runs.kernel.commit)."""

    txn: Txn
    tasks: Sequence[TaskSpec]


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
    # Composed calls that left a person's hands in this transaction (an approval decided or
    # expired, an answer given): a harnessed session parked on one of them is woken at commit.
    asks_ended: list[str] = field(default_factory=list)
    # Child runs this transaction opened, committed with it (see OpenedChild).
    children: list[OpenedChild] = field(default_factory=list)

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

    def ask_ended(self, task: Task) -> None:
        """A composed call left a person's hands: a session parked on it wakes at commit."""
        if task.composed and task.key not in self.asks_ended:
            self.asks_ended.append(task.key)
            self.due.add("wake_parked")

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

    def open_child(self, child: Txn, tasks: Sequence[TaskSpec]) -> None:
        """A child run this transaction opened (its row written): its tasks are added at commit."""
        self.children.append(OpenedChild(child, tasks))

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
        """Compare-and-set one task's status and trace it. A task completes through `complete`."""
        if to == TaskStatus.COMPLETED:
            raise ValueError("a task completes through Txn.complete, the one completion path")
        self._move(task, to, error=error, event_data=event_data, **fields)

    def _move(
        self,
        task: Task,
        to: str,
        *,
        error: tuple[str, str | None] | None = None,
        event_data: dict[str, Any] | None = None,
        **fields: Any,
    ) -> None:
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
        self.moved(task, before, to, error=error, event_data=event_data)

    def moved(
        self,
        task: Task,
        before: str,
        to: str,
        *,
        error: tuple[str, str | None] | None = None,
        event_data: dict[str, Any] | None = None,
    ) -> None:
        """Record a task's move whose row is written (held in the cache, traced, the run-level
        steps it makes due): every per-task move records itself here, whichever statement wrote it."""
        self.cache[task.key] = task
        self.event(task.key, "status", before, to, error=error_of(error), data=event_data)
        self.check_run()
        if to in ASKING_STATUSES or before in ASKING_STATUSES:
            self.announce()
            self.restamp()
        if before in ASKING_STATUSES and to not in ASKING_STATUSES:
            self.ask_ended(task)
        if to in FAILED_STATUSES or before in FAILED_STATUSES:
            self.restamp()

    def complete(
        self,
        answered: Sequence[tuple[Task | int, Any]],
        *,
        held_by: str | None = None,
        result: dict[str, Any] | None = None,
        **fields: Any,
    ) -> list[Task]:
        """The one way tasks complete, each with the value it answered (its result's `value`);
        returns the completed rows.

        The statement follows what the caller holds. Tasks whose rows this transaction holds are
        each completed by a compare-and-set on their row, `fields` written with it; `result` (if
        given) replaces the row's result, the value joining it. Calls named by id under the claim `held_by`
        (a worker's chunk, every call answered) are completed in one statement that reads their
        rows back (bulk.complete_held), each value joining its row's result; a call the claim no
        longer holds is left out of the answer. Either way each completion is recorded alike
        (`moved`), so the two statements cannot drift apart."""
        if held_by is None:
            done: list[Task] = []
            for task, value in answered:
                assert isinstance(task, Task), "a per-row completion names rows the transaction holds"
                merged = {**((task.result if result is None else result) or {}), "value": value}
                self._move(task, TaskStatus.COMPLETED, result=merged, **fields)
                done.append(task)
            return done
        assert not fields and result is None, "a chunk's completion writes its values and nothing else"
        values: list[tuple[int, Any]] = []
        for task_id, value in answered:
            assert isinstance(task_id, int), "a chunk's completion names its calls by id"
            values.append((task_id, value))
        by_id = {task.pk: task for task in complete_held(self.run.pk, held_by, values, self.now)}
        done = [by_id[task_id] for task_id, _ in values if task_id in by_id]
        for task in done:
            self.moved(task, TaskStatus.RUNNING, TaskStatus.COMPLETED)
        return done

    def claim(self, tasks: Sequence[Task], claim: str, deadline: datetime, *, queued_now: bool) -> None:
        """Claim queued calls whose rows the transaction holds (read under the run lock): one
        conditional UPDATE, the rows brought in line with it (traced by the caller, in its order)."""
        updated = claim_queued([t.pk for t in tasks], claim, self.now, deadline, queued_now=queued_now)
        if updated != len(tasks):
            raise Conflict("stale_task", "tasks changed under the run lock")
        for task in tasks:
            task.status, task.ready, task.claim, task.attempt = TaskStatus.RUNNING, False, claim, task.attempt + 1
            task.heartbeat_at = task.started_at = self.now
            task.deadline_at, task.cancel_requested = deadline, False
            if queued_now:
                task.queued_at = self.now

    def move_many(self, tasks: Sequence[Task], to: str, *, error: tuple[str, str | None] | None = None, **fields: Any) -> None:
        """The same transition for many tasks at once (skips and cancels over large graphs)."""
        if to == TaskStatus.COMPLETED:
            raise ValueError("a task completes through Txn.complete, the one completion path")
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
                for task in group:
                    self.ask_ended(task)
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
