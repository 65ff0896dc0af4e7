"""Pure graph rules: what a source's outcome means to its consumers, what a task or
join decides from its sources, and the repair candidates computed from the trace.

Nothing here touches the database (it reads only the status names of runs.models), so the property tests drive these rules directly
and the kernel applies them under its row lock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from runs.models import RUN_FINISHED, RUN_OPEN, RUN_WORKING, TASK_ASKING, TASK_FAILED, TASK_LIVE, TASK_SETTLED

# The status groups are defined once, beside the statuses in runs.models; these are the sets the
# rules test membership in. Nothing else in the kernel spells a status group out.
FAILED_STATUSES = frozenset(TASK_FAILED)
LIVE_STATUSES = frozenset(TASK_LIVE)
SETTLED_STATUSES = frozenset(TASK_SETTLED)
ASKING_STATUSES = frozenset(TASK_ASKING)
FINISHED_RUN_STATUSES = frozenset(RUN_FINISHED)
OPEN_RUN_STATUSES = frozenset(RUN_OPEN)
WORKING_RUN_STATUSES = frozenset(RUN_WORKING)
# The task kinds a Celery worker runs (the others are a person's, a runner's, or the kernel's own).
KERNEL_EXECUTED = ("tool", "round", "summarizer")

SourceState = Literal["ok", "bad", "pending"]
Decision = Literal["ready", "skip", "complete", "wait"]


def source_state(status: str, on_failure: str, failure_resolution: str | None) -> SourceState:
    """What a source's outcome means to the tasks that come after it.

    ok: it satisfies dependents (completed, or a failure absorbed by policy or by a race).
    bad: a settled non-success (skipped, canceled, a propagated or abandoned failure).
    pending: not decided yet (unfinished, or a halt/uncertain failure awaiting a person).
    """
    if status == "completed":
        return "ok"
    if status in ("skipped", "canceled"):
        return "bad"
    if status in FAILED_STATUSES:
        if failure_resolution == "absorbed":
            return "ok"
        if status == "uncertain" and failure_resolution is None:
            # Its effect may have happened: a person decides, whatever the policy (S10).
            return "pending"
        if on_failure == "absorb":
            return "ok"
        if failure_resolution == "abandoned":
            return "bad"
        if on_failure == "halt":
            # A person decides: the dependents wait, the run holds at quiescence.
            return "pending"
        return "bad"
    return "pending"


def decide(kind: str, mode: str | None, quorum: int | None, states: Sequence[SourceState]) -> Decision:
    """A waiting task's next step given its sources' states (S11, S16)."""
    ok = sum(1 for s in states if s == "ok")
    bad = sum(1 for s in states if s == "bad")
    pending = len(states) - ok - bad
    if kind == "join":
        if mode == "settled":
            # A flow's end: it waits for every source to settle, however each ended, and never skips.
            return "wait" if pending else "complete"
        if mode == "any":
            need = 1
        elif mode == "quorum":
            need = quorum or 1
        else:
            need = len(states)
        if ok >= need:
            return "complete"
        if ok + pending < need:
            return "skip"
        return "wait"
    if bad:
        return "skip"
    if pending:
        return "wait"
    return "ready"


def is_pending_failure(status: str, on_failure: str, failure_resolution: str | None) -> bool:
    """A failure that holds the run at quiescence until someone adjudicates it."""
    return status in FAILED_STATUSES and source_state(status, on_failure, failure_resolution) == "pending"


@dataclass
class TraceTask:
    key: str
    kind: str = "tool"
    on_failure: str = "propagate"
    after: list[str] = field(default_factory=list)
    mode: str | None = None
    status: str = "waiting"
    error_key: str | None = None
    failure_resolution: str | None = None


# The events `replay` reads; it skips every other.
REPLAYED_EVENTS = ("task_added", "status", "resolved")


def replay(events: Iterable[Mapping[str, Any]]) -> dict[str, TraceTask]:
    """Every task's state as the trace tells it: the trace replayed reproduces the rows."""
    tasks: dict[str, TraceTask] = {}
    for event in events:
        key = event.get("task")
        if key is None:
            continue
        name = event["event"]
        if name == "task_added":
            data = event.get("data") or {}
            tasks[key] = TraceTask(
                key=key,
                kind=data.get("kind", "tool"),
                on_failure=data.get("on_failure", "propagate"),
                after=list(data.get("after", [])),
                mode=data.get("mode"),
                status=event.get("to") or "waiting",
            )
        elif name == "status" and key in tasks:
            task = tasks[key]
            task.status = event["to"]
            error = event.get("error")
            task.error_key = error.get("key") if error else None
            if event["to"] in FAILED_STATUSES:
                task.failure_resolution = None
        elif name == "resolved" and key in tasks:
            tasks[key].failure_resolution = (event.get("data") or {}).get("resolution")
    return tasks


def race_absorbed(key: str, tasks: Mapping[str, TraceTask], consumers: Mapping[str, list[str]]) -> bool:
    """S16: a halt loser whose every consumer is a settled any|quorum barrier, or a task
    that race canceled (join_loser_canceled), is absorbed and never a candidate."""
    own = consumers.get(key, [])
    if not own:
        return False
    for consumer_key in own:
        consumer = tasks[consumer_key]
        settled_barrier = consumer.kind == "join" and consumer.mode in ("any", "quorum") and consumer.status in SETTLED_STATUSES
        race_canceled = consumer.status == "canceled" and consumer.error_key == "join_loser_canceled"
        if not (settled_barrier or race_canceled):
            return False
    return True


def consumers_of(tasks: Mapping[str, TraceTask]) -> dict[str, list[str]]:
    consumers: dict[str, list[str]] = {}
    for task in tasks.values():
        for source in task.after:
            consumers.setdefault(source, []).append(task.key)
    return consumers


def repair_candidates(events: Iterable[Mapping[str, Any]]) -> list[str]:
    """The keys retry and abandon accept, computed from the trace by the kernel's rule (S15, S16):
    status in {failed, timed_out, uncertain}, no failure_resolution, on_failure not absorb (an
    uncertain call waits for a person whatever its policy, S10), and not a halt loser of a settled race."""
    tasks = replay(events)
    consumers = consumers_of(tasks)
    return [
        task.key
        for task in tasks.values()
        if task.status in FAILED_STATUSES
        and task.failure_resolution is None
        and (task.on_failure != "absorb" or task.status == "uncertain")
        and not (holds_for_a_person(task.status, task.on_failure) and race_absorbed(task.key, tasks, consumers))
    ]


def holds_for_a_person(status: str, on_failure: str) -> bool:
    """A failure its dependents wait on until a person decides: a halt, or an uncertain call (S10, S13)."""
    return on_failure == "halt" or status == "uncertain"


def find_cycle(tasks: Sequence[Mapping[str, Any]]) -> list[str] | None:
    """A cycle among the new tasks' `after` edges, as a list of keys, or None (iterative DFS)."""
    new_keys = {t["key"] for t in tasks}
    edges = {t["key"]: [a for a in t.get("after", []) if a in new_keys] for t in tasks}
    color: dict[str, int] = dict.fromkeys(new_keys, 0)
    for root in edges:
        if color[root]:
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        path: list[str] = []
        while stack:
            node, index = stack.pop()
            if index == 0:
                color[node] = 1
                path.append(node)
            successors = edges[node]
            if index < len(successors):
                stack.append((node, index + 1))
                nxt = successors[index]
                if color[nxt] == 1:
                    return [*path[path.index(nxt) :], nxt]
                if color[nxt] == 0:
                    stack.append((nxt, 0))
            else:
                color[node] = 2
                path.pop()
    return None
