"""Expansion: tasks enter a run here — a create's and an append's (runs.kernel.intake), a child's
(runs.kernel.commit), a round's fan of tool calls, its question, and a compaction's summarizer —
and nowhere else.

`add_tasks` writes the rows, edges and their `task_added` trace, then lets scheduling make their
first moves; `expand` is the one rule by which a round grows: it goes back to waiting on the
tasks authored for it.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from typing import Any

from runs.kernel import graph
from runs.kernel.bulk import insert_tasks
from runs.kernel.compile import TaskSpec
from runs.kernel.failure import renewed_attempts
from runs.kernel.graph import FAILED_STATUSES
from runs.kernel.scheduling import evaluate, know_consumer, make_ready, release
from runs.kernel.txn import Txn
from runs.models import Edge, Task, TaskStatus


def await_token_digest(token: str) -> str:
    """Await tokens are stored as their SHA-256: the bearer proof itself rode out in the receipt only."""
    return hashlib.sha256(token.encode()).hexdigest()


def add_tasks(txn: Txn, specs: Sequence[TaskSpec]) -> dict[str, Any]:
    """Insert task rows and edges, trace them, and make their first moves. Returns the receipt."""
    if not specs:
        return {"tokens": {}}
    run = txn.run
    tokens: dict[str, str] = {}
    rows = []
    for spec in specs:
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
                # Nothing to wait for: inserted queued (no second write to queue it).
                ready=not spec.after and graph.decide(spec.kind, spec.spec.get("mode"), spec.spec.get("quorum"), []) == "ready",
            )
        )
    created = insert_tasks(rows, txn.now)
    txn.remember(created)
    for task in created:
        know_consumer(txn, task)
    Edge.objects.bulk_create([Edge(run=run, source=source, consumer=task) for task in created for source in task.after])
    for task in created:
        data: dict[str, Any] = {"kind": task.kind, "after": task.after, "on_failure": task.on_failure}
        if task.kind == "join":
            data["mode"] = task.spec.get("mode")
        if task.composed:
            data["composed"] = True
        txn.event(task.key, "task_added", None, TaskStatus.WAITING, data=data)
    for task in created:
        if task.ready:
            make_ready(txn, task, written=True)
    settled = evaluate(txn, created)
    release(txn, settled)
    return {"tokens": tokens}


def expand(txn: Txn, task: Task, specs: Sequence[TaskSpec], fields: dict[str, Any]) -> None:
    """Put `task` back to waiting (with `fields`) on the tasks `specs` author for it: the one way
    a round grows (a fan of tool calls, a question, a compaction's summarizer)."""
    txn.move(task, TaskStatus.WAITING, ready=False, **fields)
    add_tasks(txn, specs)
    new_keys = [s.key for s in specs]
    after = [*task.after, *new_keys]
    Task.objects.filter(pk=task.pk).update(after=after)
    task.after = after
    Edge.objects.bulk_create([Edge(run=txn.run, source=key, consumer=task) for key in new_keys])
    know_consumer(txn, task)
    txn.event(task.key, "expanded", data={"after": after})
    evaluate(txn, [task])


def arm_compaction_in(txn: Txn, task: Task, fields: dict[str, Any]) -> bool:
    """Author a summarizer of the round's history and make the round wait on it (S14, S23): for a
    running round that the provider refused for length, or a failed one a person compacts. False
    when there is no history to summarize."""
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
    state = {**renewed_attempts(fields.get("state", task.state)), "authored": counter, "compacting": spec.key}
    if task.status in FAILED_STATUSES:
        # The compaction is the failure's repair: resolved as retried, its error cleared.
        txn.resolve(task, "retried", by="compact")
        fields = {"error_key": None, "error_detail": None, "finished_at": None}
    expand(txn, task, [spec], {**fields, "state": state})
    return True
