"""Intake: a person's request becomes a run's tasks — a create (S30-S32) and an append (S17).

Each compiles the request whole (runs.kernel.compile), then writes in one unit of work
(runs.kernel.commit): the tasks enter through runs.kernel.expansion's `add_tasks`, the one way
tasks enter a run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import transaction

from runs.kernel.access import actor_name, require_write
from runs.kernel.commit import commit, locked
from runs.kernel.compile import check_storable, compile_create, compile_tasks
from runs.kernel.errors import Conflict, InvalidRequest
from runs.kernel.expansion import add_tasks
from runs.kernel.graph import FINISHED_RUN_STATUSES, OPEN_RUN_STATUSES
from runs.kernel.settling import release_hold
from runs.kernel.txn import Txn
from runs.models import Run, RunStatus, Task, Workspace


def create_run(*, workspace: Workspace, user: Any, body: Mapping[str, Any]) -> tuple[Run, dict[str, Any]]:
    """Compile the whole request, then write the run, its tasks and their first moves (S30-S32)."""
    require_write(user, workspace.pk)
    request = compile_create(body, workspace)
    agent_version = request.agent_version
    with transaction.atomic():
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
        commit(txn)
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
        if compiled.deliverable:
            txn.set_run(deliverable=compiled.deliverable)
        txn.event(None, "appended", data={"keys": [t.key for t in compiled.tasks], "deliverable": compiled.deliverable})
        receipt = add_tasks(txn, compiled.tasks)
        if run.status == RunStatus.NEEDS_ATTENTION:
            release_hold(txn)
        txn.check_run()
    return txn.run, receipt
