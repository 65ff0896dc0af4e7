"""Expansion: tasks enter a run here — a create, an append, a round's fan of tool calls, its
question, and a compaction's summarizer — and nowhere else.

`add_tasks` writes the rows, edges and their `task_added` trace, then lets scheduling make their
first moves; `expand` is the one rule by which a round grows: it goes back to waiting on the
tasks authored for it.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F

from runs.kernel import graph
from runs.kernel.access import actor_name, require_write
from runs.kernel.bulk import insert_tasks
from runs.kernel.compile import TaskSpec, check_storable, compile_create, compile_tasks
from runs.kernel.errors import Conflict, InvalidRequest, QuotaExceeded
from runs.kernel.failure import renewed_attempts
from runs.kernel.graph import FAILED_STATUSES, FINISHED_RUN_STATUSES, OPEN_RUN_STATUSES
from runs.kernel.scheduling import evaluate, know_consumer, make_ready, release
from runs.kernel.settling import release_hold
from runs.kernel.txn import Txn, locked
from runs.models import RUN_OPEN, Edge, Run, RunStatus, Task, TaskStatus, Workspace


def await_token_digest(token: str) -> str:
    """Await tokens are stored as their SHA-256: the bearer proof itself rode out in the receipt only."""
    return hashlib.sha256(token.encode()).hexdigest()


def quota_limits() -> dict[str, int]:
    """Each workspace's quotas (0: none): runs not finished, tasks a person's requests give one
    run, and the bytes of the inputs its runs store (`OZ0_QUOTA_*`)."""
    return {
        "active_runs": int(settings.OZ0_QUOTA_ACTIVE_RUNS),
        "tasks_per_run": int(settings.OZ0_QUOTA_TASKS_PER_RUN),
        "input_bytes": int(settings.OZ0_QUOTA_INPUT_BYTES),
    }


def input_bytes(value: Any) -> int:
    """A run input's size as the quota counts it: the bytes of its compact JSON text."""
    if value is None:
        return 0
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def _check_tasks_quota(have: int, adding: int) -> None:
    limit = quota_limits()["tasks_per_run"]
    if limit > 0 and have + adding > limit:
        raise QuotaExceeded(
            "tasks_per_run",
            limit,
            f"the run would hold {have + adding} tasks; this workspace's quota is {limit} a run",
            status=403,
        )


def _claim_run_quota(workspace: Workspace, size: int) -> None:
    """Inside the create's transaction: the workspace's row (FOR NO KEY UPDATE, which inserts of
    its runs' foreign keys do not wait for) orders its creates, so two cannot both take the last
    place; the stored bytes grow in the same transaction as the run."""
    limits = quota_limits()
    stored = Workspace.objects.select_for_update(no_key=True).filter(pk=workspace.pk).values_list("stored_input_bytes", flat=True)
    stored_bytes = int(stored.get())
    if limits["active_runs"] > 0:
        active = Run.objects.filter(workspace_id=workspace.pk, status__in=RUN_OPEN).count()
        if active >= limits["active_runs"]:
            raise QuotaExceeded(
                "active_runs",
                limits["active_runs"],
                f"the workspace has {active} runs not finished; its quota is {limits['active_runs']}",
                status=429,
            )
    if limits["input_bytes"] > 0 and stored_bytes + size > limits["input_bytes"]:
        raise QuotaExceeded(
            "input_bytes",
            limits["input_bytes"],
            f"the workspace's runs store {stored_bytes} bytes of input and this one {size}; its quota is {limits['input_bytes']}",
            status=403,
        )
    if size:
        Workspace.objects.filter(pk=workspace.pk).update(stored_input_bytes=F("stored_input_bytes") + size)


def create_run(*, workspace: Workspace, user: Any, body: Mapping[str, Any]) -> tuple[Run, dict[str, Any]]:
    """Compile the whole request, then write the run, its tasks and their first moves (S30-S32).
    A person's create is held to the workspace's quotas; nothing is written past one."""
    require_write(user, workspace.pk)
    request = compile_create(body, workspace)
    agent_version = request.agent_version
    _check_tasks_quota(0, len(request.tasks))
    with transaction.atomic():
        _claim_run_quota(workspace, input_bytes(request.input))
        run = Run.objects.create(
            workspace=workspace,
            agent_version=agent_version,
            agent_name=agent_version.agent.name if agent_version else "",
            created_by=user if user is not None and user.is_authenticated else None,
            private=request.private,
            input=request.input,
            deliverable=request.deliverable or "",
            approval=request.approval,
            retry_budget=request.retry_budget,
        )
        txn = Txn(run=run, actor=actor_name(user))
        txn.event(
            None,
            "run_created",
            None,
            RunStatus.PENDING,
            data={"agent": run.agent_name or None, "version": agent_version.version if agent_version else None},
        )
        receipt = add_tasks(txn, request.tasks)
        txn.check_run()
        txn.finish()
    return run, receipt


def append(*, run_id: Any, user: Any, body: Mapping[str, Any]) -> tuple[Run, dict[str, Any]]:
    """Add tasks to a run; an applied append releases a hold back to running (S17)."""
    if not isinstance(body, Mapping):
        raise InvalidRequest("invalid_request", "the body must be a JSON object")
    check_storable(body)
    raw_tasks = body.get("tasks") or []
    if not raw_tasks:
        raise InvalidRequest("missing_input", "an append needs `tasks`")
    with locked(run_id, actor_name(user)) as txn:
        run = txn.run
        require_write(user, run.workspace_id)
        if run.status not in OPEN_RUN_STATUSES:
            raise Conflict(
                "run_finished" if run.status in FINISHED_RUN_STATUSES else "run_canceling",
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
        if quota_limits()["tasks_per_run"] > 0:
            _check_tasks_quota(Task.objects.filter(run=run).count(), len(compiled.tasks))
        if compiled.deliverable:
            txn.set_run(deliverable=compiled.deliverable)
        txn.event(None, "appended", data={"keys": [t.key for t in compiled.tasks], "deliverable": compiled.deliverable})
        receipt = add_tasks(txn, compiled.tasks)
        if run.status == RunStatus.NEEDS_ATTENTION:
            release_hold(txn)
        txn.check_run()
    return txn.run, receipt


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
