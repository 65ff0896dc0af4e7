"""Intake: a person's request becomes a run's tasks — a create (S30-S32) and an append (S17).

Each compiles the request whole (runs.kernel.compile), then writes in one unit of work
(runs.kernel.commit): the tasks enter through runs.kernel.expansion's `add_tasks`, the one way
tasks enter a run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F

from oz0agents.code_version import code_digest
from runs.kernel.access import actor_name, require_write
from runs.kernel.commit import commit, locked
from runs.kernel.compile import Pinned, compile_create, compile_tasks
from runs.kernel.errors import Conflict, InvalidRequest, QuotaExceeded
from runs.kernel.expansion import add_tasks
from runs.kernel.graph import FINISHED_RUN_STATUSES, OPEN_RUN_STATUSES
from runs.kernel.request_shapes import APPEND_FIELDS, check_fields, refuse_unknown_fields
from runs.kernel.settling import release_hold
from runs.kernel.txn import Txn
from runs.models import RUN_OPEN, Run, RunStatus, Task
from tenancy.models import Workspace


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


def create_run(
    *, workspace: Workspace, user: Any, body: Mapping[str, Any], pinned: Pinned | None = None
) -> tuple[Run, dict[str, Any]]:
    """Compile the whole request, then write the run, its tasks and their first moves (S30-S32).
    A person's create is held to the workspace's quotas; nothing is written past one. `pinned`:
    one version of the body's agent, and the arm the run records (`compile_create`)."""
    require_write(user, workspace.pk)
    request = compile_create(body, workspace, pinned=pinned)
    agent_version = request.agent_version
    _check_tasks_quota(0, len(request.tasks))
    code = code_digest(agent_version.manifest) if agent_version else ""
    with transaction.atomic():
        _claim_run_quota(workspace, input_bytes(request.input))
        run = Run.objects.create(
            id=request.run_id,
            workspace=workspace,
            agent_version=agent_version,
            agent_name=agent_version.agent.name if agent_version else "",
            created_by=user if user is not None and user.is_authenticated else None,
            private=request.private,
            input=request.input,
            deliverable=request.deliverable or "",
            approval=request.approval,
            retry_budget=request.retry_budget,
            code_digest=code,
            priority=request.priority,
            rollout=request.rollout,
        )
        txn = Txn(run=run, actor=actor_name(user))
        created: dict[str, Any] = {"agent": run.agent_name or None, "version": agent_version.version if agent_version else None}
        if request.rollout:
            created["rollout"] = request.rollout
        txn.event(None, "run_created", None, RunStatus.PENDING, data=created)
        receipt = add_tasks(txn, request.tasks)
        txn.check_run()
        commit(txn)
    return run, receipt


def append(*, run_id: Any, user: Any, body: Mapping[str, Any]) -> tuple[Run, dict[str, Any]]:
    """Add tasks to a run; an applied append releases a hold back to running (S17)."""
    if not isinstance(body, Mapping):
        raise InvalidRequest("invalid_request", "the body must be a JSON object")
    refuse_unknown_fields(body, APPEND_FIELDS)
    check_fields(body, APPEND_FIELDS)
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
