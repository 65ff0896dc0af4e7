"""Scheduling: what a task does next once its sources move.

`evaluate` decides waiting tasks from their sources (runs.kernel.graph's rules), `release`
walks the consumers of settled keys level by level, `make_ready`/`start` take a ready task into
its kind's first live state (the approval gate for a model-composed call), a settled any|quorum
join cancels its losers, and `after_failure` applies a failed task's own policy.

`after_failure` lives here, not in runs.kernel.failure: starting a task can fail it (no such
tool, a rule denies the call), and its policy then releases or holds its consumers within the
same cascade, so the policy is part of the walk that scheduling owns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings

from oz0agents.models import AgentVersion
from runs.kernel import graph
from runs.kernel.approvals import call_decision, spec_digest
from runs.kernel.children import open_child, plan_child
from runs.kernel.graph import FAILED_STATUSES, LIVE_STATUSES
from runs.kernel.txn import Txn
from runs.models import Edge, Run, RunStatus, Task, TaskStatus
from runs.tools import get_tool
from tenancy.approvers import PLATFORM_ACTOR, call_owners


def tool_deadline(spec: Mapping[str, Any], now: datetime) -> datetime:
    """When a claimed tool call times out: its own `timeout_s` (the task's, or its agent's manifest's
    for a model-composed call), else OZ0_TOOL_TIMEOUT_SECONDS."""
    seconds = spec.get("timeout_s") or settings.OZ0_TOOL_TIMEOUT_SECONDS
    return now + timedelta(seconds=float(seconds))


# The kernel's clock on a harnessed round trails the worker's own by this much: the worker kills the
# process and reports round_timeout with its stderr and usage; the sweep only ends a round whose
# worker could not (a worker stuck or cut off from the database).
ROUND_DEADLINE_GRACE_SECONDS = 60.0


def round_timeout_seconds(harness: Any) -> float | None:
    """A harnessed round's deadline in seconds (its manifest's `harness.timeout_s`, else
    OZ0_ROUND_TIMEOUT_SECONDS); None for a round of oz0's own loop, whose provider calls have theirs."""
    if not isinstance(harness, Mapping) or "kind" not in harness:
        return None
    return float(harness.get("timeout_s") or settings.OZ0_ROUND_TIMEOUT_SECONDS)


def round_deadline(run: Run, now: datetime) -> datetime | None:
    """When the kernel's clock ends a claimed harnessed round `round_timeout` (sweep_clocks)."""
    if run.agent_version_id is None:
        return None
    harness = AgentVersion.objects.filter(pk=run.agent_version_id).values_list("manifest__harness", flat=True).first()
    seconds = round_timeout_seconds(harness)
    return None if seconds is None else now + timedelta(seconds=seconds + ROUND_DEADLINE_GRACE_SECONDS)


def source_states_of(txn: Txn, task: Task) -> list[graph.SourceState]:
    sources = txn.tasks_by_key(task.after)
    return [graph.source_state(s.status, s.on_failure, s.failure_resolution) for s in (sources[k] for k in task.after)]


def evaluate(txn: Txn, tasks: Sequence[Task]) -> list[str]:
    """Decide each waiting, unqueued task from its sources. Returns keys that settled."""
    settled: list[str] = []
    to_skip: list[tuple[Task, str]] = []
    txn.tasks_by_key({s for t in tasks for s in t.after})
    for task in tasks:
        if task.status != TaskStatus.WAITING or task.ready:
            continue
        states = source_states_of(txn, task)
        decision = graph.decide(task.kind, task.spec.get("mode"), task.spec.get("quorum"), states)
        if decision == "ready":
            make_ready(txn, task)
        elif decision == "skip":
            to_skip.append((task, skip_cause(txn, task)))
        elif decision == "complete":
            complete_join(txn, task)
            settled.append(task.key)
    if to_skip:
        for task, cause in to_skip:
            txn.defer_skip(task, cause)
        for task, _ in to_skip:
            settled.append(task.key)
            if task.kind == "join" and task.spec.get("mode") in ("any", "quorum"):
                cancel_losers(txn, task)
    return settled


def skip_cause(txn: Txn, task: Task) -> str:
    sources = txn.tasks_by_key(task.after)
    for key in task.after:
        source = sources[key]
        if graph.source_state(source.status, source.on_failure, source.failure_resolution) == "bad":
            return source.skipped_by or source.key
    return task.key


def release(txn: Txn, keys: Sequence[str], *, flush: bool = True) -> None:
    """Re-decide the waiting consumers of settled keys, level by level.

    Linear in the edges touched: consumers come from a prefetch whose depth doubles while
    a cascade keeps going (a skip over 8,000 descendants costs a handful of queries, an
    ordinary completion one), and the moves are written in bulk when the release ends, or,
    with `flush=False`, when the transaction commits: a caller that claims some of the calls it
    made ready writes their readiness with the claim (see `take_queued`).
    """
    frontier = list(dict.fromkeys(keys))
    depth = 1
    while frontier:
        unknown = [k for k in frontier if k not in txn.expanded]
        if unknown:
            prefetch_consumers(txn, unknown, depth)
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
        frontier = evaluate(txn, consumers)
    if flush:
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
SELECT t.*, w.level AS walk_level
  FROM (SELECT task_id, min(level) AS level FROM walk GROUP BY task_id) w
  JOIN runs_task t ON t.id = w.task_id
"""


def prefetch_consumers(txn: Txn, keys: Sequence[str], depth: int) -> None:
    """Load the waiting, unqueued descendants of `keys` down to `depth` levels, with their rows,
    in one query. A descendant the transaction already holds keeps its cached row: the cache may
    carry moves not yet written."""
    found = Task.objects.raw(PREFETCH_SQL, {"run": str(txn.run.pk), "keys": list(keys), "depth": depth})
    txn.expanded.update(keys)
    for row in found:
        task = txn.cache.get(row.key)
        if task is None:
            task = row
            txn.remember([row])
        know_consumer(txn, task)
        if row.walk_level < depth:  # type: ignore[attr-defined]  # the query's own column
            txn.expanded.add(task.key)


def know_consumer(txn: Txn, task: Task) -> None:
    for source in task.after:
        txn.consumers.setdefault(source, {})[task.key] = None


def make_ready(txn: Txn, task: Task, *, written: bool = False) -> None:
    """Queue a waiting task and start it. `written`: its row was inserted queued already."""
    if not written:
        txn.pending_ready.append(task)
    task.ready = True
    task.queued_at = txn.now
    txn.check_run()
    if txn.run.status != RunStatus.PAUSED:
        start(txn, task)


def start(txn: Txn, task: Task) -> None:
    """Take a ready task into its kind's first live state, or queue it for a worker."""
    if txn.run.status == RunStatus.PENDING:
        txn.move_run(RunStatus.RUNNING)
    if task.kind == "await":
        deadline = txn.now + timedelta(seconds=float(task.spec["timeout_s"])) if task.spec.get("timeout_s") else None
        to = TaskStatus.AWAITING_INPUT if task.composed else TaskStatus.DISPATCHED
        txn.move(task, to, ready=False, attempt=task.attempt + 1, started_at=txn.now, deadline_at=deadline, queued_at=txn.now)
        return
    if task.kind == "delegate":
        # A child run of the named agent, opened in this transaction (runs.kernel.children).
        start_child(txn, task)
        return
    if task.kind == "tool":
        if task.composed and not approval_granted(txn, task):
            return
        if task.spec.get("native"):
            # The approval a framework asked for before running a tool of its own (F7): granted,
            # it is the call's answer; nothing runs here.
            txn.complete(
                [(task, {"approved": True, "digest": task.approved_digest})],
                result={},
                ready=False,
                attempt=task.attempt + 1,
                started_at=txn.now,
                finished_at=txn.now,
            )
            release(txn, [task.key])
            return
        tool = get_tool(task.spec["tool"])
        if tool is None:
            txn.move(
                task,
                TaskStatus.FAILED,
                ready=False,
                error=("tool_not_served", f"no tool named {task.spec['tool']!r} is installed"),
                finished_at=txn.now,
            )
            after_failure(txn, task)
            return
        if tool.runner:
            txn.move(task, TaskStatus.DISPATCHED, ready=False, claim=None, heartbeat_at=None, queued_at=txn.now)
            return
        if tool.quick:
            txn.dispatch_quick.append(task.pk)
            return
    if task.kind == "round" and txn.runs_a_harness():
        txn.dispatch_sessions.append(task.pk)
        return
    txn.dispatch.append(task.pk)


def start_child(txn: Txn, task: Task) -> None:
    """A ready delegate task opens its child run; one whose `when:` guard is false is skipped
    (`condition_false`) and starts nothing (F17); one whose child may not start fails."""
    plan = plan_child(txn, task)
    if plan.guard_false:
        txn.move(
            task, TaskStatus.SKIPPED, ready=False, error=("condition_false", "the step's guard was false"), finished_at=txn.now
        )
        release(txn, [task.key])
        return
    if plan.refusal is not None:
        txn.move(task, TaskStatus.FAILED, ready=False, error=plan.refusal, finished_at=txn.now, attempt=task.attempt + 1)
        after_failure(txn, task)
        return
    open_child(txn, task, plan)


def approval_granted(txn: Txn, task: Task) -> bool:
    """The approval stage of a model-composed call (S4-S6). True when it may run now.

    A grant is bound to the call's digest (tool + args) and written on the task: a call whose
    approval was given to other arguments has no approval at all, and passes the stage again."""
    digest = spec_digest(task.spec)
    if task.approved_digest == digest:
        return True
    if task.approved_digest is not None:
        # Something re-authored the call after it was approved: that approval was for another call.
        txn.event(
            task.key, "approval_revoked", data={"reason": "call_changed", "approved": task.approved_digest, "digest": digest}
        )
        Task.objects.filter(pk=task.pk).update(approved_digest=None)
        task.approved_digest = None
    # A child run decides under the stricter of its own mode and its ancestors' (`by` says which
    # mode, and for a child `mode_of` whose).
    decision, by = call_decision(txn.run.approval or {}, str(task.spec.get("tool", "")), task.spec.get("args"))
    if decision == "allow" and txn.run.tainted:
        # Another agent's words steer this run's model unlabelled (F15): a person decides each call.
        decision = None
        txn.event(task.key, "approval_escalated", data={**by, "reason": "tainted", "digest": digest})
    if decision == "allow":
        # Crossed and granted in this one transaction: never observed at rest.
        txn.event(task.key, "approval_granted", data={**by, "digest": digest})
        Task.objects.filter(pk=task.pk).update(approved_digest=digest)
        task.approved_digest = digest
        return True
    if decision == "deny":
        txn.event(task.key, "approval_denied", data={**by, "digest": digest})
        txn.move(task, TaskStatus.FAILED, ready=False, error=("approval_denied", "a rule denied the call"), finished_at=txn.now)
        after_failure(txn, task)
        return False
    park = float(settings.OZ0_APPROVAL_PARK_SECONDS)
    # queued_at is when the wait on a person began: the inbox's 'waited' and its ordering.
    txn.move(
        task,
        TaskStatus.NEEDS_APPROVAL,
        ready=False,
        deadline_at=txn.now + timedelta(seconds=park),
        queued_at=txn.now,
        # A child run's wait says whose mode asked for a person (its own, or a parent's).
        event_data=by if "mode_of" in by else None,
    )
    assign(txn, task)
    return False


def assign(txn: Txn, task: Task) -> None:
    """A parked call an approver group owns is assigned to it, in the audit trail (a `verb` event
    the platform writes): who may decide it from now on. The operators' own calls need no entry."""
    owners = call_owners(txn.run.workspace_id, str(task.spec.get("tool", "")))
    if owners.by_group:
        data = {"verb": "assign", "groups": list(owners.groups), "two_approvers": owners.two_approvers}
        txn.event(task.key, "verb", data=data, actor=PLATFORM_ACTOR)


def approval_holds(txn: Txn, task: Task) -> bool:
    """Checked when a worker or runner claims a call: True when it may run with the arguments its
    row holds now. A model-composed call whose arguments no longer match its approval passes the
    stage again (usually back to needs_approval) instead of running."""
    if task.kind != "tool" or not task.composed:
        return True
    return approval_granted(txn, task)


def complete_join(txn: Txn, task: Task) -> None:
    sources = txn.tasks_by_key(task.after)
    values = {
        key: (sources[key].result or {}).get("value")
        for key in task.after
        if graph.source_state(sources[key].status, sources[key].on_failure, sources[key].failure_resolution) == "ok"
    }
    result: dict[str, Any] = {}
    if task.spec.get("mode") == "any":
        first = next(iter(values))
        value, result = values[first], {"winner": first}
    elif task.spec.get("mode") == "settled":
        value = settled_output(task, values, sources)
    else:
        value = values
    txn.complete([(task, value)], result=result, finished_at=txn.now)
    if task.spec.get("mode") in ("any", "quorum"):
        cancel_losers(txn, task)


def settled_output(join: Task, values: Mapping[str, Any], sources: Mapping[str, Task]) -> Any:
    """A flow's output (F17): the step its manifest names under `output:` (its value, null when it
    did not complete), the steps it names as a list ({id: value}), else the value of its last step,
    in the manifest's order, that completed."""
    named = join.spec.get("output")
    completed = {key: value for key, value in values.items() if sources[key].status == TaskStatus.COMPLETED}
    if isinstance(named, str):
        return completed.get(named)
    if isinstance(named, list):
        return {key: completed.get(key) for key in named}
    last = next((key for key in reversed(join.after) if key in completed), None)
    return completed[last] if last is not None else None


def cancel_losers(txn: Txn, join: Task) -> None:
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
            settled_by_race = all(race_settled(consumer_tasks[c]) for c in consumers.get(key, []))
            if not settled_by_race:
                continue
            if source.status == TaskStatus.WAITING or source.status in LIVE_STATUSES:
                cancel_task(txn, source, "join_loser_canceled", f"join {join.key!r} had its answer")
                pending.extend(source.after)
            elif (
                source.status in FAILED_STATUSES
                and source.failure_resolution is None
                and graph.holds_for_a_person(source.status, source.on_failure)
            ):
                txn.resolve(source, "absorbed", by=join.key)


def race_settled(consumer: Task) -> bool:
    barrier = (
        consumer.kind == "join" and consumer.spec.get("mode") in ("any", "quorum") and consumer.status in graph.SETTLED_STATUSES
    )
    return barrier or (consumer.status == TaskStatus.CANCELED and consumer.error_key == "join_loser_canceled")


def cancel_task(txn: Txn, task: Task, error_key: str, detail: str) -> None:
    """Cancel one unfinished task; a held call (running, or claimed by a runner) is told to stop."""
    if task.status in (TaskStatus.RUNNING,) or (task.status == TaskStatus.DISPATCHED and task.kind == "tool" and task.claim):
        Task.objects.filter(pk=task.pk).update(cancel_requested=True)
        task.cancel_requested = True
    if task.status == TaskStatus.RUNNING:
        txn.stop_child(task)
    txn.move(task, TaskStatus.CANCELED, ready=False, error=(error_key, detail), finished_at=txn.now)


def after_failure(txn: Txn, task: Task) -> None:
    """Apply the failed task's own policy (S11-S13)."""
    if txn.run.status == RunStatus.CANCELING:
        return
    if graph.holds_for_a_person(task.status, task.on_failure):
        # Checked before absorb: an uncertain call's effect may have happened, so even an absorbed
        # one waits for a person, or the next round could issue it again (S10).
        consumers = list(Edge.objects.filter(run=txn.run, source=task.key).values_list("consumer__key", flat=True))
        consumer_tasks = txn.tasks_by_key(consumers)
        if consumers and all(race_settled(c) for c in consumer_tasks.values()):
            txn.resolve(task, "absorbed", by="race")
        txn.restamp()
        return
    if task.on_failure == "absorb":
        txn.resolve(task, "absorbed")
        release(txn, [task.key])
        return
    release(txn, [task.key])
