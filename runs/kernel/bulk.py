"""Set-based writes for the kernel's hot paths: one statement for many rows, its rows one jsonb
parameter (`jsonb_to_recordset`) or its ids one array (`= ANY`), so a build's task rows, a
transaction's trace and a chunk's claim and settle each cost one round trip, with no per-row SQL
to build in Python nor to parse in the server.

The run row's lock is here too, and the run's new trace sequence rides in the trace's insert: every
kernel transaction makes those writes, and the ORM's compile of them cost more than the statements.

Every update here is a compare-and-set like the ORM moves it replaces (the status and claim a row
must still have are in the WHERE clause) and answers how many rows it changed (or, for a settle
and a named claim, the rows themselves); the callers check that under the run lock, as `Txn.move_many` does.
Inserts write fresh rows only.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from django.db import connection
from django.utils import timezone
from psycopg.types.json import Jsonb

from runs.models import Run, Task, TaskStatus


@lru_cache(maxsize=1)
def _lock_run_sql() -> str:
    # The run's input and output can be large and no transition reads them: left deferred.
    columns = ", ".join(f'"{f.column}"' for f in Run._meta.concrete_fields if f.name not in ("input", "output"))
    return f"SELECT {columns} FROM runs_run WHERE id = %s FOR UPDATE"


def lock_run(run_id: uuid.UUID) -> Run | None:
    """The run's row, locked for the transaction (None if there is no such run)."""
    return next(iter(Run.objects.raw(_lock_run_sql(), [run_id])), None)


@dataclass(slots=True)
class PendingEvent:
    """A trace event a transaction has appended and not yet written (see `insert_trace`)."""

    seq: int
    task_key: str | None
    event: str
    from_status: str | None
    to_status: str | None
    error: dict[str, Any] | None
    actor: str
    data: dict[str, Any] | None


def _records(rows: Iterable[dict[str, Any]]) -> Any:
    """Many rows as ONE jsonb parameter (read back with `jsonb_to_recordset`): one JSON encoding
    in C, where an array parameter per column quotes and escapes every element in Python (an
    array of jsonb, a JSON text per element), which cost most of an append's statements. A key
    left out, like a JSON null, reads as SQL NULL."""
    return Jsonb([{k: v for k, v in row.items() if v is not None} for row in rows])


def insert_trace(run_id: Any, events: Sequence[PendingEvent], *, run_seq: tuple[int, datetime] | None = None) -> None:
    """Insert one transaction's trace events (all of one run) in one statement. `at` is the
    moment of the write, as the model's `auto_now_add` stamps it.

    With `run_seq` (the run's new sequence and update time), the same statement writes them to
    the run row: for a transaction that changed nothing else of the run. The insights trigger on
    the trace insert reads the run's owner and `held_since`, which such an update leaves alone."""
    if not events:
        return
    prefix, prefix_params = "", []
    if run_seq is not None:
        prefix = "WITH run AS (UPDATE runs_run SET last_seq = %s, updated_at = %s WHERE id = %s) "
        prefix_params = [run_seq[0], run_seq[1], run_id]
    with connection.cursor() as cursor:
        cursor.execute(
            prefix + "INSERT INTO runs_traceevent (run_id, seq, at, task_key, event, from_status, to_status, error, actor, data) "
            "SELECT %s::uuid, u.seq, %s, u.task_key, u.event, u.from_status, u.to_status, u.error, u.actor, u.data "
            "FROM jsonb_to_recordset(%s) AS u(seq bigint, task_key varchar, event varchar, from_status varchar, "
            "to_status varchar, error jsonb, actor varchar, data jsonb)",
            [
                *prefix_params,
                run_id,
                timezone.now(),
                _records(
                    {
                        "seq": e.seq,
                        "task_key": e.task_key,
                        "event": e.event,
                        "from_status": e.from_status,
                        "to_status": e.to_status,
                        "error": e.error,
                        "actor": e.actor,
                        "data": e.data,
                    }
                    for e in events
                ),
            ],
        )


def insert_tasks(rows: Sequence[Task], now: datetime) -> list[Task]:
    """Insert new task rows (all of one run, fresh: waiting, never attempted; queued when the row
    says `ready`, as of `now`) in one statement, positioned in their order after the run's last
    task; sets each row's id, position and creation time and returns the rows."""
    if not rows:
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            'INSERT INTO runs_task (run_id, key, kind, "after", on_failure, spec, lineage, composed, resolution_token, '
            "position, status, ready, attempt, state, cancel_requested, created_at, queued_at) "
            "SELECT %s::uuid, u.key, u.kind, ARRAY(SELECT jsonb_array_elements_text(u.after))::varchar[], u.on_failure, "
            "u.spec, u.lineage, u.composed, u.token, "
            "(SELECT COALESCE(MAX(position), 0) FROM runs_task WHERE run_id = %s::uuid) + u.n, %s, u.ready, 0, '{}'::jsonb, "
            "false, %s, CASE WHEN u.ready THEN %s::timestamptz END "
            "FROM jsonb_to_recordset(%s) AS u(key varchar, kind varchar, after jsonb, on_failure varchar, "
            "spec jsonb, lineage varchar, composed boolean, token varchar, n integer, ready boolean) "
            "RETURNING id, key, position",
            [
                rows[0].run_id,
                rows[0].run_id,
                TaskStatus.WAITING,
                now,
                now,
                _records(
                    {
                        "key": t.key,
                        "kind": t.kind,
                        "after": list(t.after),
                        "on_failure": t.on_failure,
                        "spec": t.spec,
                        "lineage": t.lineage,
                        "composed": t.composed,
                        "token": t.resolution_token,
                        "n": n,
                        "ready": bool(t.ready),
                    }
                    for n, t in enumerate(rows, start=1)
                ),
            ],
        )
        written = {key: (pk, position) for pk, key, position in cursor.fetchall()}
    for task in rows:
        task.pk, task.position = written[task.key]
        task.status, task.ready, task.attempt, task.state = TaskStatus.WAITING, bool(task.ready), 0, {}
        task.queued_at = now if task.ready else None
        task.cancel_requested, task.created_at = False, now
        task._state.adding = False
        task._state.db = connection.alias
    return list(rows)


def mark_ready(task_ids: Sequence[int], now: datetime) -> int:
    """Queue waiting tasks for the workers; answers how many were still waiting."""
    if not task_ids:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE runs_task SET ready = true, queued_at = %s WHERE id = ANY(%s::bigint[]) AND status = %s",
            [now, list(task_ids), TaskStatus.WAITING],
        )
        return int(cursor.rowcount)


def skip_waiting(task_ids: Sequence[int], cause: str, now: datetime) -> int:
    """Skip waiting tasks because of the failure `cause` (a propagation over a large graph)."""
    if not task_ids:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE runs_task SET status = %s, skipped_by = %s, finished_at = %s, ready = false "
            "WHERE id = ANY(%s::bigint[]) AND status = %s",
            [TaskStatus.SKIPPED, cause, now, list(task_ids), TaskStatus.WAITING],
        )
        return int(cursor.rowcount)


def claim_queued(task_ids: Sequence[int], claim: str, now: datetime, deadline: datetime, *, queued_now: bool = False) -> int:
    """Claim queued calls for one worker: waiting and ready → running under `claim`, attempt + 1.
    `queued_now`: the calls were made ready by this same transaction and their readiness is not
    written yet; the claim writes it (their queue time) in the same statement."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE runs_task SET status = %s, ready = false, claim = %s, heartbeat_at = %s, started_at = %s, "
            "attempt = attempt + 1, cancel_requested = false, deadline_at = %s"
            + (
                ", queued_at = %s WHERE id = ANY(%s::bigint[]) AND status = %s AND NOT ready"
                if queued_now
                else " WHERE id = ANY(%s::bigint[]) AND status = %s AND ready"
            ),
            [TaskStatus.RUNNING, claim, now, now, deadline, *([now] if queued_now else []), list(task_ids), TaskStatus.WAITING],
        )
        return int(cursor.rowcount)


def claim_named(run_id: Any, task_ids: Sequence[int], claim: str, now: datetime, deadline: datetime) -> list[Task]:
    """Claim queued calls a message named, in one statement that also reads them: waiting and
    ready tool calls of the run that no model composed (those pass the approval stage first) →
    running under `claim`, attempt + 1. Returns the rows as they now stand."""
    return list(
        Task.objects.raw(
            "UPDATE runs_task AS t SET status = %s, ready = false, claim = %s, heartbeat_at = %s, started_at = %s, "
            "attempt = t.attempt + 1, cancel_requested = false, deadline_at = %s "
            "WHERE t.id = ANY(%s::bigint[]) AND t.run_id = %s AND t.status = %s AND t.ready AND t.kind = 'tool' "
            "AND NOT t.composed RETURNING t.*",
            [TaskStatus.RUNNING, claim, now, now, deadline, list(task_ids), run_id, TaskStatus.WAITING],
        )
    )


def complete_held(run_id: Any, claim: str, values: Sequence[tuple[int, Any]], now: datetime) -> list[Task]:
    """Settle calls that answered values as completed, in one statement that also reads them: only
    the calls of the run `claim` still holds running change; returns their rows as they now stand."""
    if not values:
        return []
    return list(
        Task.objects.raw(
            "UPDATE runs_task AS t SET status = %s, finished_at = %s, claim = NULL, "
            "result = COALESCE(t.result, '{}'::jsonb) || jsonb_build_object('value', u.value) "
            "FROM jsonb_to_recordset(%s) AS u(id bigint, value jsonb) "
            "WHERE t.id = u.id AND t.run_id = %s AND t.status = %s AND t.claim = %s RETURNING t.*",
            [
                TaskStatus.COMPLETED,
                now,
                _records({"id": task_id, "value": value} for task_id, value in values),
                run_id,
                TaskStatus.RUNNING,
                claim,
            ],
        )
    )
