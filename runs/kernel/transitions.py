"""Every run and task transition (see the package docstring for the rules they keep)."""

from __future__ import annotations

import fnmatch
import hashlib
import secrets
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F, Max, Q
from django.utils import timezone

from oz0site import realtime
from runs import failures
from runs.kernel import graph
from runs.kernel.errors import Conflict, Forbidden, InvalidRequest, NotFound
from runs.kernel.validation import TaskSpec, check_storable, compile_approval, compile_tasks
from runs.models import (
    AgentVersion,
    Edge,
    Finding,
    Run,
    RunStatus,
    Task,
    TaskStatus,
    TraceEvent,
    Workspace,
)
from runs.permissions import has_write_standing, is_member

LIVE = tuple(graph.LIVE_STATUSES)
FAILED = tuple(graph.FAILED_STATUSES)
RUN_OPEN = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.PAUSED, RunStatus.NEEDS_ATTENTION)
KERNEL_EXECUTED = ("tool", "round", "summarizer")


@dataclass
class _Txn:
    """One kernel transaction on one run, holding the run's row lock."""

    run: Run
    actor: str
    now: datetime = field(default_factory=timezone.now)
    events: list[TraceEvent] = field(default_factory=list)
    dispatch: list[int] = field(default_factory=list)
    # Ready calls of quick tools (see runs.tools.Tool.quick): sent to workers in chunks.
    dispatch_quick: list[int] = field(default_factory=list)
    cache: dict[str, Task] = field(default_factory=dict)
    changed: bool = False
    check_run: bool = False
    restamp: bool = False
    announce: bool = False
    run_fields: set[str] = field(default_factory=set)
    finding_step: Task | None = None
    # Write-behind for the two moves a release makes in bulk (readiness and skips): one
    # UPDATE per transaction instead of one per task. Flushed before anything reads them.
    pending_ready: list[Task] = field(default_factory=list)
    pending_skips: dict[str, list[Task]] = field(default_factory=dict)
    # Waiting consumers known per source key, and the keys whose consumers are all known.
    consumers: dict[str, dict[str, None]] = field(default_factory=dict)
    expanded: set[str] = field(default_factory=set)

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
            TraceEvent(
                run=self.run,
                seq=self.run.last_seq,
                at=self.now,
                task_key=task_key,
                event=event,
                from_status=from_status,
                to_status=to_status,
                error=error,
                actor=self.actor if actor is None else actor,
                data=data,
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
        if to in FAILED:
            # A new failure is unresolved, whatever settled the one before it.
            values.setdefault("failure_resolution", None)
        updated = Task.objects.filter(pk=task.pk, status=before).update(**values)
        if updated != 1:
            raise Conflict("stale_task", f"task {task.key!r} is no longer {before}")
        for name, value in values.items():
            setattr(task, name, value)
        self.cache[task.key] = task
        self.event(
            task.key,
            "status",
            before,
            to,
            error={"key": error[0], "detail": error[1]} if error else None,
            data=event_data,
        )
        self.check_run = True
        if to in ("needs_approval", "awaiting_input") or before in ("needs_approval", "awaiting_input"):
            self.announce = True
            self.restamp = True
        if to in FAILED or before in FAILED:
            self.restamp = True

    def move_many(self, tasks: Sequence[Task], to: str, *, error: tuple[str, str | None] | None = None, **fields: Any) -> None:
        """The same transition for many tasks at once (skips and cancels over large graphs)."""
        by_status: dict[str, list[Task]] = {}
        for task in tasks:
            by_status.setdefault(task.status, []).append(task)
        values: dict[str, Any] = {"status": to, **fields}
        if error is not None:
            values["error_key"], values["error_detail"] = error
        if to in FAILED:
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
                self.event(task.key, "status", before, to, error={"key": error[0], "detail": error[1]} if error else None)
            if before in ("needs_approval", "awaiting_input"):
                self.announce = True
                self.restamp = True
        self.check_run = True

    def resolve(self, task: Task, resolution: str | None, **data: Any) -> None:
        Task.objects.filter(pk=task.pk).update(failure_resolution=resolution)
        task.failure_resolution = resolution
        self.cache[task.key] = task
        self.event(task.key, "resolved", data={"resolution": resolution, **data})
        self.restamp = True
        self.check_run = True

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
        self.check_run = True

    def flush(self) -> None:
        if self.pending_ready:
            ids = [t.pk for t in self.pending_ready if t.status == TaskStatus.WAITING]
            if ids:
                Task.objects.filter(pk__in=ids, status=TaskStatus.WAITING).update(ready=True, queued_at=self.now)
            self.pending_ready = []
        for cause, group in self.pending_skips.items():
            ids = [t.pk for t in group]
            updated = Task.objects.filter(pk__in=ids, status=TaskStatus.WAITING).update(
                status=TaskStatus.SKIPPED, skipped_by=cause, finished_at=self.now, ready=False
            )
            if updated != len(ids):
                raise Conflict("stale_task", "tasks changed under the run lock")
        self.pending_skips = {}

    # ---- commit ----
    def finish(self) -> None:
        self.flush()
        if self.check_run:
            _settle_run(self)
        if self.restamp:
            _restamp(self)
        if self.announce:
            _announce(self)
        if self.events:
            TraceEvent.objects.bulk_create(self.events)
        if self.run_fields:
            self.run.save(update_fields=[*sorted(self.run_fields), "updated_at"])
        if self.dispatch or self.dispatch_quick:
            ids = list(dict.fromkeys(self.dispatch))
            quick = [i for i in dict.fromkeys(self.dispatch_quick) if i not in ids]
            run_id = self.run.pk
            transaction.on_commit(lambda: _send(ids, run_id, quick))
        if self.changed:
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
            groups = [realtime.run_group(run.id), realtime.workspace_group(run.workspace_id)]
            transaction.on_commit(lambda: realtime.publish(groups, payload))


def _send(task_ids: list[int], run_id: Any = None, quick: Sequence[int] = ()) -> None:
    from runs.tasks import execute_batch, execute_task

    run = str(run_id) if run_id is not None else None
    for task_id in task_ids:
        execute_task.delay(task_id, run)
    for chunk in quick_chunks(list(quick)):
        execute_batch.delay(chunk, run)


def quick_chunks(ids: list[int]) -> list[list[int]]:
    """Split ready quick calls into one message per chunk: a chunk is claimed, run and reported in
    two transactions, yet there are enough chunks for every worker process to take a share."""
    if not ids:
        return []
    size = max(1, int(settings.OZ0_QUICK_BATCH))
    parts = max(1, int(settings.OZ0_QUICK_SPREAD))
    size = max(1, min(size, -(-len(ids) // parts)))
    return [ids[i : i + size] for i in range(0, len(ids), size)]


@contextmanager
def _locked(run_id: Any, actor: str = "") -> Iterator[_Txn]:
    with transaction.atomic():
        try:
            # The run's input and output can be large and no transition reads them.
            run = Run.objects.select_for_update().defer("input", "output").get(pk=run_id)
        except (Run.DoesNotExist, ValueError, TypeError, ValidationError):
            raise NotFound("run") from None
        txn = _Txn(run=run, actor=actor)
        yield txn
        txn.finish()


def _actor_name(user: Any) -> str:
    if user is None:
        return "kernel"
    return getattr(user, "username", str(user))


def _require_write(user: Any, workspace_id: int) -> None:
    if user is None:
        return  # the kernel's own callers (sweeps, the demo loader) act for the platform
    if not is_member(user, workspace_id):
        raise NotFound("workspace")
    if not has_write_standing(user, workspace_id):
        raise Forbidden()


# =====================================================================
# create and append
# =====================================================================


def create_run(*, workspace: Workspace, user: Any, body: Mapping[str, Any]) -> tuple[Run, dict[str, Any]]:
    """Validate the whole request, then write the run, its tasks and their first moves (S30-S32)."""
    _require_write(user, workspace.pk)
    if not isinstance(body, Mapping):
        raise InvalidRequest("invalid_request", "the body must be a JSON object")
    check_storable(body)
    unknown = set(body) - {"agent", "input", "tasks", "deliverable", "approval", "retry", "private"}
    if unknown:
        raise InvalidRequest("unknown_field", f"unknown field(s): {', '.join(sorted(unknown))}")
    agent_version = _agent_version(body.get("agent"), workspace)
    manifest = agent_version.manifest if agent_version else {}
    raw_tasks = body.get("tasks")
    if not raw_tasks and agent_version is not None:
        raw_tasks = [_agent_round(manifest, body.get("input"))]
    if not raw_tasks:
        raise InvalidRequest("missing_input", "a run needs `tasks`, or an `agent` whose manifest drives it")
    deliverable = body.get("deliverable")
    if deliverable is None and isinstance(raw_tasks, list) and raw_tasks and isinstance(raw_tasks[-1], Mapping):
        deliverable = raw_tasks[-1].get("key")
    compiled = compile_tasks(raw_tasks, deliverable=deliverable)
    approval = compile_approval(body.get("approval"), default_mode=str(manifest.get("approval", {}).get("mode", "ask")))
    if not body.get("approval") and manifest.get("approval", {}).get("rules"):
        approval["rules"] = list(manifest["approval"]["rules"])
    retry_budget = _retry_budget(body.get("retry"))
    private = body.get("private", False)
    if not isinstance(private, bool):
        raise InvalidRequest("invalid_field", "`private` must be true or false")

    with transaction.atomic():
        run = Run.objects.create(
            workspace=workspace,
            agent_version=agent_version,
            agent_name=agent_version.agent.name if agent_version else "",
            created_by=user if user is not None and user.is_authenticated else None,
            private=private,
            input=body.get("input"),
            deliverable=compiled.deliverable or "",
            approval=approval,
            retry_budget=retry_budget,
        )
        txn = _Txn(run=run, actor=_actor_name(user))
        txn.event(
            None,
            "run_created",
            None,
            RunStatus.PENDING,
            data={"agent": run.agent_name or None, "version": agent_version.version if agent_version else None},
        )
        receipt = _add_tasks(txn, compiled.tasks)
        txn.check_run = True
        txn.finish()
    return run, receipt


def append(*, run_id: Any, user: Any, body: Mapping[str, Any]) -> tuple[Run, dict[str, Any]]:
    """Add tasks to a run; an applied append releases a hold back to running (S17)."""
    if not isinstance(body, Mapping):
        raise InvalidRequest("invalid_request", "the body must be a JSON object")
    check_storable(body)
    unknown = set(body) - {"tasks", "deliverable"}
    if unknown:
        raise InvalidRequest("unknown_field", f"unknown field(s): {', '.join(sorted(unknown))}")
    raw_tasks = body.get("tasks") or []
    if not raw_tasks:
        raise InvalidRequest("missing_input", "an append needs `tasks`")
    with _locked(run_id, _actor_name(user)) as txn:
        run = txn.run
        _require_write(user, run.workspace_id)
        if run.status not in RUN_OPEN:
            raise Conflict(
                "run_finished" if run.status in (RunStatus.COMPLETED, RunStatus.CANCELED) else "run_canceling",
                f"the run is {run.status}",
            )
        referenced: set[str] = set()
        if isinstance(raw_tasks, list):
            for raw in raw_tasks:
                if isinstance(raw, Mapping):
                    referenced.add(str(raw.get("key")))
                    after = raw.get("after")
                    if isinstance(after, list):
                        referenced.update(str(a) for a in after)
        if isinstance(body.get("deliverable"), str):
            referenced.add(body["deliverable"])
        existing = dict(Task.objects.filter(run=run, key__in=referenced).values_list("key", "kind"))
        compiled = compile_tasks(raw_tasks, existing_keys=existing, deliverable=body.get("deliverable"))
        if compiled.deliverable:
            txn.set_run(deliverable=compiled.deliverable)
        txn.event(None, "appended", data={"keys": [t.key for t in compiled.tasks], "deliverable": compiled.deliverable})
        receipt = _add_tasks(txn, compiled.tasks)
        if run.status == RunStatus.NEEDS_ATTENTION:
            _release_hold(txn)
        txn.check_run = True
    return txn.run, receipt


def _agent_version(name: Any, workspace: Workspace) -> AgentVersion | None:
    """The latest version of the run's workspace's agent of that name: agents belong to a workspace."""
    if name is None:
        return None
    if not isinstance(name, str):
        raise InvalidRequest("invalid_field", "`agent` must be an agent's name")
    version = (
        AgentVersion.objects.select_related("agent")
        .filter(agent__workspace=workspace, agent__name=name)
        .order_by("-version")
        .first()
    )
    if version is None:
        raise InvalidRequest("unknown_agent", f"no agent named {name!r} is registered in workspace {workspace.slug!r}")
    return version


def _agent_round(manifest: Mapping[str, Any], run_input: Any) -> dict[str, Any]:
    """The first round of an agent's manifest loop."""
    tools = [t for t in manifest.get("tools", []) if isinstance(t, str)]
    return {
        "key": "r1",
        "kind": "round",
        "model": manifest.get("model", "script"),
        "fallback_models": list(manifest.get("fallback_models", [])),
        "prompt": manifest.get("instructions", ""),
        "tools": tools,
        **({"script": manifest["script"]} if "script" in manifest else {}),
    }


def _retry_budget(raw: Any) -> int:
    if raw is None:
        return 0
    budget = raw.get("budget", 0) if isinstance(raw, Mapping) else None
    if not isinstance(budget, int) or isinstance(budget, bool) or not 0 <= budget <= 100:
        raise InvalidRequest("invalid_field", "`retry` must be {budget: a whole number from 0 to 100}")
    return budget


def _add_tasks(txn: _Txn, specs: Sequence[TaskSpec]) -> dict[str, Any]:
    """Insert task rows and edges, trace them, and make their first moves. Returns the receipt."""
    if not specs:
        return {"tokens": {}}
    run = txn.run
    start = (Task.objects.filter(run=run).aggregate(m=Max("position"))["m"] or 0) + 1
    tokens: dict[str, str] = {}
    rows = []
    for offset, spec in enumerate(specs):
        token_digest = None
        if spec.kind == "await" and not spec.composed:
            token = secrets.token_urlsafe(24)
            tokens[spec.key] = token
            token_digest = await_token_digest(token)
        rows.append(
            Task(
                run=run,
                key=spec.key,
                kind=spec.kind,
                after=spec.after,
                on_failure=spec.on_failure,
                spec=spec.spec,
                composed=spec.composed,
                lineage=spec.lineage or spec.key,
                resolution_token=token_digest,
                position=start + offset,
            )
        )
    created = Task.objects.bulk_create(rows)
    txn.remember(created)
    for task in created:
        _know_consumer(txn, task)
    Edge.objects.bulk_create([Edge(run=run, source=source, consumer=task) for task in created for source in task.after])
    for task in created:
        data: dict[str, Any] = {"kind": task.kind, "after": task.after, "on_failure": task.on_failure}
        if task.kind == "join":
            data["mode"] = task.spec.get("mode")
        if task.composed:
            data["composed"] = True
        txn.event(task.key, "task_added", None, TaskStatus.WAITING, data=data)
    settled = _evaluate(txn, created)
    _release(txn, settled)
    return {"tokens": tokens}


# =====================================================================
# scheduling
# =====================================================================


def _source_states(txn: _Txn, task: Task) -> list[graph.SourceState]:
    sources = txn.tasks_by_key(task.after)
    return [graph.source_state(s.status, s.on_failure, s.failure_resolution) for s in (sources[k] for k in task.after)]


def _evaluate(txn: _Txn, tasks: Sequence[Task]) -> list[str]:
    """Decide each waiting, unqueued task from its sources. Returns keys that settled."""
    settled: list[str] = []
    to_skip: list[tuple[Task, str]] = []
    txn.tasks_by_key({s for t in tasks for s in t.after})
    for task in tasks:
        if task.status != TaskStatus.WAITING or task.ready:
            continue
        states = _source_states(txn, task)
        decision = graph.decide(task.kind, task.spec.get("mode"), task.spec.get("quorum"), states)
        if decision == "ready":
            _make_ready(txn, task)
        elif decision == "skip":
            to_skip.append((task, _skip_cause(txn, task)))
        elif decision == "complete":
            _complete_join(txn, task)
            settled.append(task.key)
    if to_skip:
        for task, cause in to_skip:
            txn.defer_skip(task, cause)
        for task, _ in to_skip:
            settled.append(task.key)
            if task.kind == "join" and task.spec.get("mode") in ("any", "quorum"):
                _cancel_losers(txn, task)
    return settled


def _skip_cause(txn: _Txn, task: Task) -> str:
    sources = txn.tasks_by_key(task.after)
    for key in task.after:
        source = sources[key]
        if graph.source_state(source.status, source.on_failure, source.failure_resolution) == "bad":
            return source.skipped_by or source.key
    return task.key


def _release(txn: _Txn, keys: Sequence[str]) -> None:
    """Re-decide the waiting consumers of settled keys, level by level.

    Linear in the edges touched: consumers come from a prefetch whose depth doubles while
    a cascade keeps going (a skip over 8,000 descendants costs a handful of queries, an
    ordinary completion one), and the moves are written in bulk when the release ends.
    """
    frontier = list(dict.fromkeys(keys))
    depth = 1
    while frontier:
        unknown = [k for k in frontier if k not in txn.expanded]
        if unknown:
            _prefetch_consumers(txn, unknown, depth)
            depth = min(depth * 2, 512)
        seen: set[str] = set()
        consumers: list[Task] = []
        for key in frontier:
            for consumer_key in txn.consumers.get(key, ()):
                task = txn.cache.get(consumer_key)
                if consumer_key not in seen and task is not None and task.status == TaskStatus.WAITING and not task.ready:
                    seen.add(consumer_key)
                    consumers.append(task)
        if not consumers:
            break
        frontier = _evaluate(txn, consumers)
    txn.flush()


# LATERAL with OFFSET 0 (a planning fence) keeps each step an index lookup per row of the
# walk: the planner cannot tell the walk is small and, left alone, joins every edge of the
# run at every level.
PREFETCH_SQL = """
WITH RECURSIVE walk(task_id, task_key, level) AS (
    SELECT t.id, t.key, 1
      FROM unnest(%(keys)s::varchar[]) AS k(source)
     CROSS JOIN LATERAL (
        SELECT e.consumer_id FROM runs_edge e WHERE e.run_id = %(run)s AND e.source = k.source OFFSET 0
     ) e
     CROSS JOIN LATERAL (
        SELECT t.id, t.key FROM runs_task t WHERE t.id = e.consumer_id AND t.status = 'waiting' AND NOT t.ready OFFSET 0
     ) t
    UNION
    SELECT t.id, t.key, w.level + 1
      FROM walk w
     CROSS JOIN LATERAL (
        SELECT e.consumer_id FROM runs_edge e WHERE e.run_id = %(run)s AND e.source = w.task_key OFFSET 0
     ) e
     CROSS JOIN LATERAL (
        SELECT t.id, t.key FROM runs_task t WHERE t.id = e.consumer_id AND t.status = 'waiting' AND NOT t.ready OFFSET 0
     ) t
     WHERE w.level < %(depth)s
)
SELECT task_id, min(level) FROM walk GROUP BY task_id
"""


def _prefetch_consumers(txn: _Txn, keys: Sequence[str], depth: int) -> None:
    """Load the waiting, unqueued descendants of `keys` down to `depth` levels in one query."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(PREFETCH_SQL, {"run": str(txn.run.pk), "keys": list(keys), "depth": depth})
        levels: dict[int, int] = dict(cursor.fetchall())
    txn.expanded.update(keys)
    if not levels:
        return
    by_id = {t.pk: t for t in txn.cache.values() if t.pk in levels}
    missing = [task_id for task_id in levels if task_id not in by_id]
    if missing:
        fresh = list(Task.objects.filter(pk__in=missing))
        txn.remember(fresh)
        by_id.update((t.pk, t) for t in fresh)
    for task_id, level in levels.items():
        task = by_id.get(task_id)
        if task is None:
            continue
        _know_consumer(txn, task)
        if level < depth:
            txn.expanded.add(task.key)


def _know_consumer(txn: _Txn, task: Task) -> None:
    for source in task.after:
        txn.consumers.setdefault(source, {})[task.key] = None


def _make_ready(txn: _Txn, task: Task) -> None:
    txn.pending_ready.append(task)
    task.ready = True
    task.queued_at = txn.now
    txn.check_run = True
    if txn.run.status != RunStatus.PAUSED:
        _start(txn, task)


def _start(txn: _Txn, task: Task) -> None:
    """Take a ready task into its kind's first live state, or queue it for a worker."""
    if txn.run.status == RunStatus.PENDING:
        txn.move_run(RunStatus.RUNNING)
    if task.kind == "await":
        deadline = txn.now + timedelta(seconds=float(task.spec["timeout_s"])) if task.spec.get("timeout_s") else None
        to = TaskStatus.AWAITING_INPUT if task.composed else TaskStatus.DISPATCHED
        txn.move(task, to, ready=False, attempt=task.attempt + 1, started_at=txn.now, deadline_at=deadline, queued_at=txn.now)
        return
    if task.kind == "tool":
        if task.composed and not _approval_granted(txn, task):
            return
        from runs.tools import get_tool

        tool = get_tool(task.spec["tool"])
        if tool is None:
            txn.move(
                task,
                TaskStatus.FAILED,
                ready=False,
                error=("tool_not_served", f"no tool named {task.spec['tool']!r} is installed"),
                finished_at=txn.now,
            )
            _after_failure(txn, task)
            return
        if tool.runner:
            txn.move(task, TaskStatus.DISPATCHED, ready=False, claim=None, heartbeat_at=None, queued_at=txn.now)
            return
        if tool.quick:
            txn.dispatch_quick.append(task.pk)
            return
    txn.dispatch.append(task.pk)


def _approval_granted(txn: _Txn, task: Task) -> bool:
    """The approval stage of a model-composed call (S4-S6). True when it may run now."""
    approval = txn.run.approval or {}
    mode = approval.get("mode", "ask")
    tool_name = task.spec.get("tool", "")
    if task.state.get("approved"):
        return True
    decision = None
    if mode == "bypass":
        decision = "allow"
    elif mode == "rules":
        for rule in approval.get("rules", []):
            if fnmatch.fnmatchcase(tool_name, rule["tool"]):
                decision = rule["decision"]
                break
    if decision == "allow":
        # Crossed and granted in this one transaction: never observed at rest.
        txn.event(task.key, "approval_granted", data={"by": mode})
        return True
    if decision == "deny":
        txn.event(task.key, "approval_denied", data={"by": "rules"})
        txn.move(task, TaskStatus.FAILED, ready=False, error=("approval_denied", "a rule denied the call"), finished_at=txn.now)
        _after_failure(txn, task)
        return False
    park = float(settings.OZ0_APPROVAL_PARK_SECONDS)
    # queued_at is when the wait on a person began: the inbox's 'waited' and its ordering.
    txn.move(task, TaskStatus.NEEDS_APPROVAL, ready=False, deadline_at=txn.now + timedelta(seconds=park), queued_at=txn.now)
    return False


def _complete_join(txn: _Txn, task: Task) -> None:
    sources = txn.tasks_by_key(task.after)
    values = {
        key: (sources[key].result or {}).get("value")
        for key in task.after
        if graph.source_state(sources[key].status, sources[key].on_failure, sources[key].failure_resolution) == "ok"
    }
    if task.spec.get("mode") == "any":
        first = next(iter(values))
        result: dict[str, Any] = {"value": values[first], "winner": first}
    else:
        result = {"value": values}
    txn.move(task, TaskStatus.COMPLETED, result=result, finished_at=txn.now)
    if task.spec.get("mode") in ("any", "quorum"):
        _cancel_losers(txn, task)


def _cancel_losers(txn: _Txn, join: Task) -> None:
    """A settled any|quorum join cancels its unfinished sources nobody else needs (S16),
    and absorbs halt losers whose every consumer the race has settled."""
    # A key is looked at again whenever the race cancels one of its consumers: a loser examined
    # before its other consumer was canceled in the same pass is absorbed once that cancel lands.
    # Each task is canceled at most once, so the walk ends.
    pending = list(join.after)
    while pending:
        keys = list(dict.fromkeys(pending))
        pending = []
        sources = txn.tasks_by_key(keys)
        consumer_rows = Edge.objects.filter(run=txn.run, source__in=keys).values_list("source", "consumer__key")
        consumers: dict[str, list[str]] = {}
        for source_key, consumer_key in consumer_rows:
            consumers.setdefault(source_key, []).append(consumer_key)
        consumer_tasks = txn.tasks_by_key({c for cs in consumers.values() for c in cs})
        for key in keys:
            source = sources[key]
            settled_by_race = all(_race_settled(consumer_tasks[c]) for c in consumers.get(key, []))
            if not settled_by_race:
                continue
            if source.status == TaskStatus.WAITING or source.status in LIVE:
                _cancel_task(txn, source, "join_loser_canceled", f"join {join.key!r} had its answer")
                pending.extend(source.after)
            elif (
                source.status in FAILED
                and source.failure_resolution is None
                and graph.holds_for_a_person(source.status, source.on_failure)
            ):
                txn.resolve(source, "absorbed", by=join.key)


def _race_settled(consumer: Task) -> bool:
    barrier = (
        consumer.kind == "join" and consumer.spec.get("mode") in ("any", "quorum") and consumer.status in graph.SETTLED_STATUSES
    )
    return barrier or (consumer.status == TaskStatus.CANCELED and consumer.error_key == "join_loser_canceled")


def _cancel_task(txn: _Txn, task: Task, error_key: str, detail: str) -> None:
    """Cancel one unfinished task; a held call (running, or claimed by a runner) is told to stop."""
    if task.status in (TaskStatus.RUNNING,) or (task.status == TaskStatus.DISPATCHED and task.kind == "tool" and task.claim):
        Task.objects.filter(pk=task.pk).update(cancel_requested=True)
        task.cancel_requested = True
    txn.move(task, TaskStatus.CANCELED, ready=False, error=(error_key, detail), finished_at=txn.now)


# =====================================================================
# run-level settling: quiescence, holds, attention, announcements
# =====================================================================


def _busy(run: Run) -> bool:
    return Task.objects.filter(run=run).filter(Q(status__in=LIVE) | Q(status=TaskStatus.WAITING, ready=True)).exists()


def _pending_failures(run: Run) -> list[tuple[str, str | None]]:
    """The unresolved failures that hold the run, in graph order: (key, error key)."""
    rows = (
        Task.objects.filter(run=run, status__in=FAILED, failure_resolution__isnull=True)
        .filter(~Q(on_failure="absorb") | Q(status=TaskStatus.UNCERTAIN))
        .order_by("position")
        .values_list("key", "status", "on_failure", "failure_resolution", "error_key")
    )
    return [
        (key, error_key)
        for key, status, policy, resolution, error_key in rows
        if graph.is_pending_failure(status, policy, resolution)
    ]


def _halt_stamp(pending: list[tuple[str, str | None]]) -> dict[str, Any]:
    """The attention of a run held on failures: which tasks, and the kinds they failed with."""
    return {
        "reason": "halt_failure",
        "blocked_task_keys": [key for key, _ in pending],
        "kinds": failures.kinds_of(error_key for _, error_key in pending),
    }


def _settle_run(txn: _Txn) -> None:
    run = txn.run
    if run.status == RunStatus.CANCELING:
        if not Task.objects.filter(run=run, status__in=LIVE).exists():
            leftovers = list(Task.objects.filter(run=run, status=TaskStatus.WAITING))
            if leftovers:
                txn.move_many(leftovers, TaskStatus.CANCELED, ready=False, error=("run_canceled", None), finished_at=txn.now)
            _finish_canceled(txn)
        return
    if run.status not in (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.NEEDS_ATTENTION):
        return
    if _busy(run):
        if run.status == RunStatus.NEEDS_ATTENTION:
            _release_hold(txn)
        return
    pending = _pending_failures(run)
    if pending:
        _hold(txn, _halt_stamp(pending))
        return
    deliverable = Task.objects.filter(run=run, key=run.deliverable).first()
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
            "kinds": failures.kinds_of([cause.error_key]) if cause is not None else [],
        },
    )


def _failure_behind(txn: _Txn, task: Task | None) -> Task | None:
    """The failed task that left `task` unresolved: itself, or the failure its skip came from."""
    if task is None:
        return None
    if task.status in FAILED:
        return task
    if task.status == TaskStatus.SKIPPED and task.skipped_by:
        cause = txn.tasks_by_key([task.skipped_by]).get(task.skipped_by)
        if cause is not None and cause.status in FAILED:
            return cause
    return None


def _hold(txn: _Txn, attention: dict[str, Any]) -> None:
    """Rest the run on a person (S13, S18). A hold on a failure carries that failure, as a cancel
    would (F1): the first blocked task's kind and flags, with its error's words as the message."""
    run = txn.run
    if run.attention != attention:
        txn.set_run(attention=attention)
        txn.event(None, "attention", data=attention)
    if run.held_since is None:
        txn.set_run(held_since=txn.now)
    failure, step = _hold_failure(txn, attention)
    if run.failure != failure:
        txn.set_run(failure=failure)
    txn.move_run(RunStatus.NEEDS_ATTENTION)
    txn.restamp = False
    if failure is not None:
        _record_finding(txn, failure, step)


def _hold_failure(txn: _Txn, attention: Mapping[str, Any]) -> tuple[dict[str, Any] | None, Task | None]:
    keys = attention.get("blocked_task_keys") or []
    if not keys:
        return None, None
    blocked = txn.tasks_by_key([keys[0]]).get(keys[0])
    cause = _failure_behind(txn, blocked)
    if cause is None:
        return None, None
    return failures.platform_failure(failures.kind_for_error_key(cause.error_key), cause.error_detail), cause


def _release_hold(txn: _Txn) -> None:
    txn.set_run(held_since=None, failure=None)
    txn.move_run(RunStatus.RUNNING)
    txn.restamp = True


def _restamp(txn: _Txn) -> None:
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


def _announce(txn: _Txn) -> None:
    run = txn.run
    statuses = set(
        Task.objects.filter(
            run=run, status__in=(TaskStatus.NEEDS_APPROVAL, TaskStatus.AWAITING_INPUT), composed=True
        ).values_list("status", flat=True)
    )
    announcements = []
    if run.status not in (RunStatus.COMPLETED, RunStatus.CANCELED):
        if TaskStatus.NEEDS_APPROVAL in statuses:
            announcements.append("approval_required")
        if TaskStatus.AWAITING_INPUT in statuses:
            announcements.append("awaiting_human")
    if announcements != list(run.announcements):
        txn.set_run(announcements=announcements)
        for name in set(announcements) - set(run.announcements or []):
            txn.event(None, "announced", data={"announcement": name})


def _finish_canceled(txn: _Txn) -> None:
    run = txn.run
    txn.set_run(finished_at=txn.now, announcements=[], held_since=None)
    txn.move_run(RunStatus.CANCELED)
    _record_finding(txn, run.failure or failures.platform_failure("cancelled", None), txn.finding_step)


def _record_finding(txn: _Txn, failure: Mapping[str, Any], step: Task | None) -> None:
    """Count the run as failed, by kind, once (F18): when it first holds on a failure, or when it
    ends canceled having never held on one. A later hold or the cancel of a counted run adds
    nothing, so the rollups the triggers keep count runs, not episodes; repairs count apart."""
    run = txn.run
    if Finding.objects.filter(run_id=run.id).exists():
        return
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
        error_key=(step.error_key or "") if step else "",
        attempts=step.attempt if step else 0,
        created_at=txn.now,
    )


# =====================================================================
# worker-side: claim, heartbeat, report
# =====================================================================


def tool_deadline(spec: Mapping[str, Any], now: datetime) -> datetime:
    """When a claimed tool call times out: its own `timeout_s` (the task's, or its agent's manifest's
    for a model-composed call), else OZ0_TOOL_TIMEOUT_SECONDS."""
    seconds = spec.get("timeout_s") or settings.OZ0_TOOL_TIMEOUT_SECONDS
    return now + timedelta(seconds=float(seconds))


@dataclass(frozen=True)
class Claimed:
    task_id: int
    run_id: str
    key: str
    kind: str
    spec: dict[str, Any]
    attempt: int
    claim: str
    state: dict[str, Any]
    lineage: str


def claim_task(task_id: int, claim: str, run_id: Any = None) -> Claimed | None:
    """Take a queued task for execution. A redelivered or duplicate message finds nothing to take."""
    if run_id is None:
        run_id = Task.objects.filter(pk=task_id).values_list("run_id", flat=True).first()
        if run_id is None:
            return None
    with _locked(run_id, "worker") as txn:
        if txn.run.status not in (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.NEEDS_ATTENTION):
            return None
        task = Task.objects.filter(pk=task_id, status=TaskStatus.WAITING, ready=True).first()
        if task is None or task.kind not in KERNEL_EXECUTED:
            return None
        txn.move(
            task,
            TaskStatus.RUNNING,
            ready=False,
            claim=claim,
            heartbeat_at=txn.now,
            started_at=txn.now,
            attempt=task.attempt + 1,
            cancel_requested=False,
            deadline_at=tool_deadline(task.spec, txn.now) if task.kind == "tool" else None,
        )
        # Taking a queued task cannot make the run quiescent: skip the settle queries.
        txn.check_run = False
        _KNOWN_RUNS[task.pk] = task.run_id
        return Claimed(task.pk, str(task.run_id), task.key, task.kind, task.spec, task.attempt, claim, task.state, task.lineage)


def heartbeat(task_id: int, claim: str) -> bool:
    """Prove the claimant alive. Returns True when the kernel wants the call to stop."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE runs_task SET heartbeat_at = %s WHERE id = %s AND claim = %s AND status = 'running' RETURNING cancel_requested",
            [timezone.now(), task_id, claim],
        )
        row = cursor.fetchone()
    # No row: the claim is gone (a cancel, a lost race or a sweep won), so stop.
    return row is None or bool(row[0])


def _claimed(txn: _Txn, task_id: int, claim: str) -> Task | None:
    task = Task.objects.filter(
        pk=task_id, run=txn.run, claim=claim, status__in=(TaskStatus.RUNNING, TaskStatus.DISPATCHED)
    ).first()
    if task is not None:
        txn.remember([task])
    return task


# task id -> run id for the tasks this process claimed: a task never changes runs.
_KNOWN_RUNS: dict[int, Any] = {}


def _run_of(task_id: int) -> Any:
    if task_id in _KNOWN_RUNS:
        return _KNOWN_RUNS[task_id]
    if len(_KNOWN_RUNS) > 10_000:
        _KNOWN_RUNS.clear()
    run_id = Task.objects.filter(pk=task_id).values_list("run_id", flat=True).first()
    if run_id is None:
        raise NotFound("task")
    return run_id


def task_complete(
    task_id: int, claim: str, value: Any, *, extra: Mapping[str, Any] | None = None, state: Mapping[str, Any] | None = None
) -> bool:
    """The claimant finished the call. False when the claim was lost (a cancel or a sweep won)."""
    with _locked(_run_of(task_id), "worker") as txn:
        task = _claimed(txn, task_id, claim)
        if task is None:
            return False
        result = {**_merge_result(txn, task, extra), "value": value}
        fields: dict[str, Any] = {"result": result, "finished_at": txn.now, "claim": None}
        if state is not None:
            fields["state"] = dict(state)
        txn.move(task, TaskStatus.COMPLETED, **fields)
        _release(txn, [task.key])
        return True


def task_fail(
    task_id: int,
    claim: str,
    error_key: str,
    detail: str | None = None,
    *,
    status: str = TaskStatus.FAILED,
    extra: Mapping[str, Any] | None = None,
    state: Mapping[str, Any] | None = None,
) -> bool:
    """The claimant's call failed with a typed error."""
    with _locked(_run_of(task_id), "worker") as txn:
        task = _claimed(txn, task_id, claim)
        if task is None:
            return False
        fields: dict[str, Any] = {"finished_at": txn.now, "claim": None}
        if extra:
            fields["result"] = _merge_result(txn, task, extra)
        if state is not None:
            fields["state"] = dict(state)
        _fail_claimed(txn, task, status, error_key, detail, fields)
        return True


WORKER_ERROR_DETAIL_MAX = 2000


def task_errored(task_id: int, claim: str, error: BaseException) -> bool:
    """The worker met an exception it has no word for while it held the call: the call fails with
    the key `error` (kind `error`) under its own policy, never re-run blind, never left claimed."""
    detail = f"{type(error).__name__}: {error}"[:WORKER_ERROR_DETAIL_MAX]
    with _locked(_run_of(task_id), "worker") as txn:
        task = _claimed(txn, task_id, claim)
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
        _after_failure(txn, task)
        return True


@dataclass(frozen=True)
class Outcome:
    """What a worker says of one call of a batch: a value, a typed error, or that it stopped."""

    task_id: int
    value: Any = None
    error: tuple[str, str | None] | None = None
    stopped: bool = False


def claim_batch(task_ids: Sequence[int], claim: str, run_id: Any) -> list[Claimed]:
    """Take several queued quick calls of one run in one transaction (those still queued)."""
    with _locked(run_id, "worker") as txn:
        if txn.run.status not in (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.NEEDS_ATTENTION):
            return []
        tasks = list(
            Task.objects.filter(pk__in=list(task_ids), run=txn.run, status=TaskStatus.WAITING, ready=True, kind="tool").order_by(
                "position"
            )
        )
        if not tasks:
            return []
        # One conditional UPDATE for the chunk (the rows were read under the run lock).
        updated = Task.objects.filter(pk__in=[t.pk for t in tasks], status=TaskStatus.WAITING, ready=True).update(
            status=TaskStatus.RUNNING,
            ready=False,
            claim=claim,
            heartbeat_at=txn.now,
            started_at=txn.now,
            attempt=F("attempt") + 1,
            cancel_requested=False,
            deadline_at=tool_deadline({}, txn.now),
        )
        if updated != len(tasks):
            raise Conflict("stale_task", "tasks changed under the run lock")
        for task in tasks:
            if task.spec.get("timeout_s"):
                Task.objects.filter(pk=task.pk).update(deadline_at=tool_deadline(task.spec, txn.now))
        claimed = []
        for task in tasks:
            task.status, task.ready, task.claim, task.attempt = TaskStatus.RUNNING, False, claim, task.attempt + 1
            txn.event(task.key, "status", TaskStatus.WAITING, TaskStatus.RUNNING)
            claimed.append(
                Claimed(task.pk, str(task.run_id), task.key, task.kind, task.spec, task.attempt, claim, task.state, task.lineage)
            )
        txn.remember(tasks)
        return claimed


def report_batch(run_id: Any, claim: str, outcomes: Sequence[Outcome], *, take: int = 0) -> list[int]:
    """Settle a batch's calls in one transaction and release their consumers once.

    Returns up to `take` quick calls this release made ready, which the reporting worker runs
    next itself instead of sending them through the broker (a chain of quick calls then costs
    no broker round trip per step). Should the worker die first, the lost-message sweep sends them.
    """
    with _locked(run_id, "worker") as txn:
        held = {
            t.pk: t
            for t in Task.objects.filter(
                pk__in=[o.task_id for o in outcomes], run=txn.run, claim=claim, status=TaskStatus.RUNNING
            )
        }
        txn.remember(held.values())
        completed: list[Task] = []
        for outcome in outcomes:
            task = held.get(outcome.task_id)
            if task is None:
                continue
            if outcome.stopped:
                txn.move(task, TaskStatus.CANCELED, error=("run_canceled", None), finished_at=txn.now, claim=None)
            elif outcome.error is not None:
                key, detail = outcome.error
                _fail_claimed(txn, task, TaskStatus.FAILED, key, detail, {"finished_at": txn.now, "claim": None})
            else:
                task.status, task.finished_at, task.claim = TaskStatus.COMPLETED, txn.now, None
                task.result = {**(task.result or {}), "value": outcome.value}
                txn.event(task.key, "status", TaskStatus.RUNNING, TaskStatus.COMPLETED)
                completed.append(task)
        if completed:
            # One UPDATE for the chunk's completions: the rows are held by this claim under the run lock.
            Task.objects.bulk_update(completed, ["status", "result", "finished_at", "claim"])
            txn.check_run = True
        _release(txn, [t.key for t in completed])
        taken = txn.dispatch_quick[:take]
        del txn.dispatch_quick[:take]
        return taken


def heartbeat_claim(claim: str) -> bool:
    """Prove a batch's claimant alive; True when the kernel wants any of its calls to stop."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE runs_task SET heartbeat_at = %s WHERE claim = %s AND status = 'running' RETURNING cancel_requested",
            [timezone.now(), claim],
        )
        rows = cursor.fetchall()
    return not rows or any(row[0] for row in rows)


def _fail_claimed(txn: _Txn, task: Task, status: str, error_key: str, detail: str | None, fields: dict[str, Any]) -> None:
    """Fail a claimed task: an automatic re-run when its retry budget allows (S28), else its policy."""
    if _auto_retry(txn, task, error_key, detail, fields):
        return
    txn.move(task, status, error=(error_key, detail), **fields)
    _after_failure(txn, task)


# Failures a blind re-run cannot mend: the seeds forbid it (provider_error), the route is
# spent (refusals, exhaustion), or a compaction is the repair (S23-S28).
NOT_AUTO_RETRIED = frozenset(
    {
        "provider_error",
        "model_route_spent",
        "model_refused",
        "provider_overloaded",
        "provider_transient_exhausted",
        "attempt_budget_spent",
        "provider_model_unavailable",
        "provider_context_overflow",
        # A worker's unexpected exception is no model flake: a blind re-run would meet it again.
        "error",
        # Neither is a request the route cannot take or the store cannot hold, nor a source that is gone.
        "model_capability_unavailable",
        "context_overflow",
        "missing_input",
        "input_source_unavailable",
    }
)


def _auto_retry(txn: _Txn, task: Task, error_key: str, detail: str | None, fields: dict[str, Any]) -> bool:
    """S28: a failed model step re-runs automatically `retry.budget` times before its policy applies."""
    if task.kind not in ("round", "summarizer") or txn.run.status == RunStatus.CANCELING or task.cancel_requested:
        return False
    if error_key in NOT_AUTO_RETRIED:
        return False
    used = int(task.state.get("auto_retries", 0))
    if used >= txn.run.retry_budget:
        return False
    state = {**task.state, **(fields.get("state") or {}), "auto_retries": used + 1}
    txn.move(task, TaskStatus.FAILED, error=(error_key, detail), **{**fields, "state": state})
    txn.event(task.key, "auto_retry", data={"used": used + 1, "budget": txn.run.retry_budget})
    txn.move(
        task, TaskStatus.WAITING, ready=False, error_key=None, error_detail=None, finished_at=None, state=_renewed_attempts(state)
    )
    _make_ready(txn, task)
    return True


def _after_failure(txn: _Txn, task: Task) -> None:
    """Apply the failed task's own policy (S11-S13)."""
    if txn.run.status == RunStatus.CANCELING:
        return
    if graph.holds_for_a_person(task.status, task.on_failure):
        # Checked before absorb: an uncertain call's effect may have happened, so even an absorbed
        # one waits for a person, or the next round could issue it again (S10).
        consumers = list(Edge.objects.filter(run=txn.run, source=task.key).values_list("consumer__key", flat=True))
        consumer_tasks = txn.tasks_by_key(consumers)
        if consumers and all(_race_settled(c) for c in consumer_tasks.values()):
            txn.resolve(task, "absorbed", by="race")
        txn.restamp = True
        return
    if task.on_failure == "absorb":
        txn.resolve(task, "absorbed")
        _release(txn, [task.key])
        return
    _release(txn, [task.key])


def task_stopped(task_id: int, claim: str) -> bool:
    """The claimant stopped because the kernel asked it to (a run cancel)."""
    with _locked(_run_of(task_id), "worker") as txn:
        task = _claimed(txn, task_id, claim)
        if task is None:
            return False
        txn.move(task, TaskStatus.CANCELED, error=("run_canceled", None), finished_at=txn.now, claim=None)
        return True


# =====================================================================
# verbs
# =====================================================================


def _trace_rows(run: Run) -> list[dict[str, Any]]:
    return [
        {"task": key, "event": event, "to": to, "error": error, "data": data}
        for key, event, to, error, data in TraceEvent.objects.filter(run=run)
        .order_by("seq")
        .values_list("task_key", "event", "to_status", "error", "data")
    ]


def _verb_task(txn: _Txn, user: Any, key: str) -> Task:
    _require_write(user, txn.run.workspace_id)
    if txn.run.status in (RunStatus.COMPLETED, RunStatus.CANCELED):
        raise Conflict("run_finished", f"the run is {txn.run.status}; it accepts no verb but reading")
    task = Task.objects.filter(run=txn.run, key=key).first()
    if task is None:
        raise NotFound("task")
    txn.remember([task])
    return task


def _require_candidate(txn: _Txn, task: Task) -> None:
    if txn.run.status == RunStatus.CANCELING:
        raise Conflict("run_canceling", "the run is being canceled")
    if task.key not in graph.repair_candidates(_trace_rows(txn.run)):
        raise Conflict("not_a_candidate", f"task {task.key!r} is not a retry or abandon candidate (S15, S16)")


def retry(*, run_id: Any, key: str, user: Any) -> Run:
    """Run a failed task again under its own lineage; what its failure skipped comes back."""
    with _locked(run_id, _actor_name(user)) as txn:
        task = _verb_task(txn, user, key)
        _require_candidate(txn, task)
        if task.kind in ("round", "summarizer"):
            refusal = _route_refusal(task)
            if refusal:
                raise Conflict("model_route_spent", refusal)
        txn.event(task.key, "verb", data={"verb": "retry"})
        txn.resolve(task, "retried")
        txn.move(
            task,
            TaskStatus.WAITING,
            ready=False,
            claim=None,
            cancel_requested=False,
            error_key=None,
            error_detail=None,
            finished_at=None,
            state=_renewed_attempts(task.state) if task.kind in ("round", "summarizer") else _renewed(task.state),
        )
        revived = list(Task.objects.filter(run=txn.run, status=TaskStatus.SKIPPED, skipped_by=task.key))
        if revived:
            revived = [txn.cache.get(t.key, t) for t in revived]
            txn.move_many(revived, TaskStatus.WAITING, skipped_by=None, ready=False, finished_at=None)
        if txn.run.status == RunStatus.NEEDS_ATTENTION:
            _release_hold(txn)
        _make_ready(txn, task)
        settled = _evaluate(txn, revived)
        _release(txn, settled)
        return txn.run


def abandon(*, run_id: Any, key: str, user: Any) -> Run:
    """Settle a failure as resolved: it no longer holds the run, and its dependents are skipped."""
    with _locked(run_id, _actor_name(user)) as txn:
        task = _verb_task(txn, user, key)
        _require_candidate(txn, task)
        txn.event(task.key, "verb", data={"verb": "abandon"})
        txn.resolve(task, "abandoned")
        _release(txn, [task.key])
        if txn.run.status == RunStatus.NEEDS_ATTENTION:
            _release_hold(txn)
        return txn.run


def compact(*, run_id: Any, key: str, user: Any) -> Run:
    """Repair a round by authoring a summarizer for it (S14, S23)."""
    with _locked(run_id, _actor_name(user)) as txn:
        task = _verb_task(txn, user, key)
        if task.kind != "round":
            raise Conflict("not_a_candidate", "only a round can be compacted")
        _require_candidate(txn, task)
        txn.event(task.key, "verb", data={"verb": "compact"})
        if not arm_compaction_in(txn, task, {}):
            raise Conflict("not_a_candidate", "the round has no history to summarize")
        if txn.run.status == RunStatus.NEEDS_ATTENTION:
            _release_hold(txn)
        return txn.run


def approve(*, run_id: Any, key: str, user: Any) -> Run:
    with _locked(run_id, _actor_name(user)) as txn:
        task = _verb_task(txn, user, key)
        if task.status != TaskStatus.NEEDS_APPROVAL:
            raise Conflict("not_pending", f"task {key!r} is {task.status}, not waiting for approval")
        txn.event(task.key, "verb", data={"verb": "approve"})
        state = {**task.state, "approved": True}
        txn.move(task, TaskStatus.WAITING, ready=False, state=state, deadline_at=None)
        _make_ready(txn, task)
        return txn.run


def deny(*, run_id: Any, key: str, user: Any, reason: str) -> Run:
    with _locked(run_id, _actor_name(user)) as txn:
        task = _verb_task(txn, user, key)
        if task.status != TaskStatus.NEEDS_APPROVAL:
            raise Conflict("not_pending", f"task {key!r} is {task.status}, not waiting for approval")
        txn.event(task.key, "verb", data={"verb": "deny"})
        # The model reads a denied call in the approver's words, not the tool's (F14).
        state = {**task.state, "denied_by": txn.actor}
        txn.move(
            task,
            TaskStatus.FAILED,
            error=("approval_denied", reason or "denied"),
            finished_at=txn.now,
            deadline_at=None,
            state=state,
        )
        _after_failure(txn, task)
        return txn.run


def answer(*, run_id: Any, key: str, user: Any, value: Any) -> Run:
    """Answer a model's question (a tokenless await in awaiting_input)."""
    check_storable(value)
    with _locked(run_id, _actor_name(user)) as txn:
        task = _verb_task(txn, user, key)
        if task.status != TaskStatus.AWAITING_INPUT:
            raise Conflict("not_pending", f"task {key!r} is {task.status}, not awaiting input")
        txn.move(task, TaskStatus.COMPLETED, result={"value": value}, finished_at=txn.now, deadline_at=None)
        _release(txn, [task.key])
        return txn.run


def await_token_digest(token: str) -> str:
    """Await tokens are stored as their SHA-256: the bearer proof itself rode out in the receipt only."""
    return hashlib.sha256(token.encode()).hexdigest()


AWAIT_ERROR_MAX = 2000


def resolve_await(*, token: Any, user: Any, value: Any, error: Any = None) -> Run:
    """Resolve a client-authored await with its bearer proof (S8): with its value, or, given an
    `error`, fail it with `await_failed` under its own policy (what it waited on failed). The proof
    names the await; the resolver still needs write standing in its workspace, as every write
    surface does (S32)."""
    check_storable(value)
    if error is not None:
        if not isinstance(error, str) or not error.strip():
            raise InvalidRequest("invalid_field", "`error` must be a non-empty text saying what failed")
        if value is not None:
            raise InvalidRequest("invalid_request", "give the await a `value` or an `error`, not both")
        if len(error) > AWAIT_ERROR_MAX:
            raise InvalidRequest("invalid_field", f"`error` is {len(error)} characters; at most {AWAIT_ERROR_MAX}")
    if not isinstance(token, str) or not token or len(token) > 200:
        raise NotFound("await")
    digest = await_token_digest(token)
    run_id = Task.objects.filter(resolution_token=digest).values_list("run_id", flat=True).first()
    if run_id is None:
        raise NotFound("await")
    with _locked(run_id, _actor_name(user)) as txn:
        if user is not None and not is_member(user, txn.run.workspace_id):
            raise NotFound("await")
        _require_write(user, txn.run.workspace_id)
        task = Task.objects.get(resolution_token=digest)
        txn.remember([task])
        if task.status != TaskStatus.DISPATCHED:
            raise Conflict("not_pending", f"the await is {task.status}")
        if error is not None:
            txn.move(task, TaskStatus.FAILED, error=("await_failed", error), finished_at=txn.now, deadline_at=None)
            _after_failure(txn, task)
            return txn.run
        txn.move(task, TaskStatus.COMPLETED, result={"value": value}, finished_at=txn.now, deadline_at=None)
        _release(txn, [task.key])
        return txn.run


def cancel_run(
    *, run_id: Any, user: Any, reason: str = "", failure: dict[str, Any] | None = None, step: Task | None = None
) -> Run:
    """Stop a run: unstarted work is canceled at once, in-flight calls are told to stop."""
    with _locked(run_id, _actor_name(user)) as txn:
        _require_write(user, txn.run.workspace_id)
        _cancel(txn, reason=reason, failure=failure, step=step)
        return txn.run


def _cancel(txn: _Txn, *, reason: str, failure: dict[str, Any] | None, step: Task | None) -> None:
    run = txn.run
    if run.status in (RunStatus.COMPLETED, RunStatus.CANCELED):
        raise Conflict("run_finished", f"the run is already {run.status}")
    if run.status == RunStatus.CANCELING:
        raise Conflict("run_canceling", "the run is already being canceled")
    if failure is None:
        failure, step = _cancel_failure(txn, reason)
    txn.finding_step = step
    txn.set_run(failure=failure, error=run.error or "canceled", attention=None)
    txn.event(None, "verb", data={"verb": "cancel"})
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
    txn.check_run = True


def _cancel_failure(txn: _Txn, reason: str) -> tuple[dict[str, Any], Task | None]:
    """SPEC.md: a person canceling a held run fails it with the hold's own kind; else `cancelled`."""
    run = txn.run
    if run.status == RunStatus.NEEDS_ATTENTION:
        failure, step = _hold_failure(txn, run.attention or {})
        if failure is not None:
            return {**failure, "message": reason or None}, step
    return failures.platform_failure("cancelled", reason or None), None


def fail_run(txn: _Txn, failure: dict[str, Any], error_text: str, step: Task) -> None:
    """End the run canceled with an agent's own failure (oz.fail)."""
    txn.set_run(error=error_text)
    _cancel(txn, reason="", failure=failure, step=step)


def pause_run(*, run_id: Any, user: Any) -> Run:
    with _locked(run_id, _actor_name(user)) as txn:
        _require_write(user, txn.run.workspace_id)
        if txn.run.status not in (RunStatus.PENDING, RunStatus.RUNNING):
            raise Conflict("not_pausable", f"the run is {txn.run.status}")
        txn.event(None, "verb", data={"verb": "pause"})
        txn.move_run(RunStatus.PAUSED)
        return txn.run


def resume_run(*, run_id: Any, user: Any) -> Run:
    with _locked(run_id, _actor_name(user)) as txn:
        _require_write(user, txn.run.workspace_id)
        if txn.run.status != RunStatus.PAUSED:
            raise Conflict("not_paused", f"the run is {txn.run.status}")
        txn.event(None, "verb", data={"verb": "resume"})
        txn.move_run(RunStatus.RUNNING)
        ready = list(Task.objects.filter(run=txn.run, status=TaskStatus.WAITING, ready=True).order_by("position"))
        txn.remember(ready)
        for task in ready:
            _start(txn, task)
        txn.check_run = True
        return txn.run


def _merge_result(txn: _Txn, task: Task, extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """Fold a worker's report into the task's result; each provider call becomes a trace event."""
    extra = dict(extra or {})
    for call in extra.pop("provider_calls", []):
        txn.event(task.key, "provider_call", data=call)
    return {**(task.result or {}), **extra}


def _wait_on(txn: _Txn, task: Task, specs: list[TaskSpec], fields: dict[str, Any]) -> None:
    """Author `specs` and put the running round back to waiting on them."""
    txn.move(task, TaskStatus.WAITING, ready=False, **fields)
    _add_tasks(txn, specs)
    new_keys = [s.key for s in specs]
    after = [*task.after, *new_keys]
    Task.objects.filter(pk=task.pk).update(after=after)
    task.after = after
    Edge.objects.bulk_create([Edge(run=txn.run, source=key, consumer=task) for key in new_keys])
    _know_consumer(txn, task)
    txn.event(task.key, "expanded", data={"after": after})
    _evaluate(txn, [task])


def arm_compaction_in(txn: _Txn, task: Task, fields: dict[str, Any]) -> bool:
    history = list(task.state.get("history", []))
    if len(history) <= 1 or task.state.get("compacted_at") == len(history):
        return False
    counter = int(task.state.get("authored", 0)) + 1
    spec = TaskSpec(
        key=f"{task.key}.{counter}",
        kind="summarizer",
        after=[],
        on_failure="propagate",
        spec={"model": task.spec.get("model"), "of": task.key, "fallback_models": []},
        composed=True,
        lineage=task.lineage,
    )
    fields["state"] = {**_renewed_attempts(fields.get("state", task.state)), "authored": counter, "compacting": spec.key}
    if task.status in FAILED:
        txn.resolve(task, "retried", by="compact")
        txn.move(
            task, TaskStatus.WAITING, ready=False, error_key=None, error_detail=None, finished_at=None, state=fields["state"]
        )
        fields = {}
        _add_tasks(txn, [spec])
        after = [*task.after, spec.key]
        Task.objects.filter(pk=task.pk).update(after=after)
        task.after = after
        Edge.objects.create(run=txn.run, source=spec.key, consumer=task)
        _know_consumer(txn, task)
        txn.event(task.key, "expanded", data={"after": after})
        _evaluate(txn, [task])
    else:
        _wait_on(txn, task, [spec], fields)
    return True


def _renewed_attempts(state: Mapping[str, Any]) -> dict[str, Any]:
    """A round run again (a retry, an automatic re-run, a compaction) starts its step with a fresh
    attempt budget on every route that is not spent; a spent route stays spent (S26, S28)."""
    return {**_renewed(state), "step_attempts": {}}


def _renewed(state: Mapping[str, Any]) -> dict[str, Any]:
    """A task run again starts with no lost workers counted against it."""
    return {k: v for k, v in state.items() if k != "expired_claims"}


def _route_refusal(task: Task) -> str | None:
    """A manual retry cannot renew a refused or exhausted route (S25, S26): it needs an unspent one."""
    spent = set(task.state.get("spent_routes", []))
    if not spent:
        return None
    routes = [task.spec.get("model"), *task.spec.get("fallback_models", [])]
    if any(route not in spent for route in routes):
        return None
    return "every route of this step is spent: " + ", ".join(str(r) for r in routes)
