"""Released sessions (issue 29: waits hold nothing). A harnessed session waiting on a person longer
than OZ0_SESSION_PARK_SECONDS whose process cannot be parked (JSON-lines) keeps its process and
its claim but gives its thread back: `round_release` marks the round `released: {on, since}`
in its state, the session worker's keeper (runs/worker/harness/keeper.py) heartbeats it with the
other released ones (`heartbeat_many`) and watches the call `on`; once it is decided,
`round_reattach` takes a session slot again and a thread drives the session on. A released
round counts against no slot (`running_sessions`). Its claim stays under the lease: a session
worker lost while it waits stops heartbeating, and the lease sweep queues the round again, its
calls answered from the journal as a retry's are. Time released is not running time: the
round's deadline stops while it is released.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from runs.kernel.commit import locked
from runs.kernel.graph import ASKING_STATUSES, OPEN_RUN_STATUSES
from runs.kernel.worker import SESSION_SLOTS_LOCK, Claimed, held_task, running_sessions
from runs.models import Task


def round_release(claimed: Claimed, *, on: str) -> bool:
    """The session waits on `on`, a call in a person's hands, and gives its thread back (its process
    kept). False, and nothing changes, when the claim is gone, the run is stopping, or `on` is no
    longer a person's (decided meanwhile: the session reads the answer instead)."""
    with locked(claimed.run_id, "worker") as txn:
        task = held_task(txn, claimed)
        if task is None or task.cancel_requested or txn.run.status not in OPEN_RUN_STATUSES:
            return False
        waited = Task.objects.filter(run=txn.run, key=on).values_list("status", flat=True).first()
        if waited not in ASKING_STATUSES:
            return False
        released: dict[str, Any] = {"on": on, "since": txn.now.isoformat()}
        if task.deadline_at is not None:
            # Time released is not running time (as time parked is not): the clock stops here.
            released["deadline_left"] = max(0.0, (task.deadline_at - txn.now).total_seconds())
        task.state = {**task.state, "released": released}
        Task.objects.filter(pk=task.pk).update(state=task.state, deadline_at=None)
        txn.event(task.key, "session_released", data={"on": on})
        return True


def round_reattach(claimed: Claimed, per_workspace: int) -> bool | None:
    """A released session's call was decided: it takes one of its workspace's session slots again
    (`session_reattached`). False when they are all held (it stays released, asked again later);
    None when the claim is gone."""
    with locked(claimed.run_id, "worker") as txn:
        task = held_task(txn, claimed)
        if task is None:
            return None
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [SESSION_SLOTS_LOCK, str(txn.run.workspace_id)])
        if per_workspace > 0 and running_sessions(txn.run.workspace_id) >= per_workspace:
            return False
        if "released" in task.state:
            left = task.state["released"].get("deadline_left")
            task.state = {k: v for k, v in task.state.items() if k != "released"}
            fields: dict[str, Any] = {"state": task.state}
            if left is not None:
                fields["deadline_at"] = txn.now + timedelta(seconds=float(left))
            Task.objects.filter(pk=task.pk).update(**fields)
            txn.event(task.key, "session_reattached", data={})
        return True


def heartbeat_many(claims: Sequence[str]) -> set[str]:
    """Prove many claims alive in one statement (the keeper's released sessions): the claims whose
    holder must stop (a cancel asked, or the claim gone)."""
    if not claims:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE runs_task SET heartbeat_at = %s WHERE claim = ANY(%s) AND status = 'running' "
            "RETURNING claim, cancel_requested",
            [timezone.now(), list(claims)],
        )
        rows = cursor.fetchall()
    alive = {claim for claim, canceled in rows if not canceled}
    return set(claims) - alive


def call_states(task_ids: Sequence[int]) -> dict[int, tuple[str, Any]]:
    """The status and failure resolution of the calls released sessions wait on, in one query."""
    rows = Task.objects.filter(pk__in=list(task_ids)).values_list("pk", "status", "failure_resolution")
    return {pk: (status, resolution) for pk, status, resolution in rows}
