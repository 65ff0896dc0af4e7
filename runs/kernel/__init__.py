"""The run kernel: the one writer of run and task statuses.

Every transition runs inside one transaction that holds the run's row lock
(`SELECT ... FOR UPDATE`), changes rows with a condition on their current status,
and appends its trace events in the same transaction. Celery sends and channel
broadcasts are registered with `transaction.on_commit`, so nothing leaves the
process for a change that rolled back.

Views, Celery tasks, consumers and commands call the functions exported here;
nobody else assigns a status.
"""

from __future__ import annotations

from runs.kernel.errors import Conflict, Forbidden, InvalidRequest, KernelError, NotFound
from runs.kernel.transitions import (
    Outcome,
    abandon,
    answer,
    append,
    approve,
    cancel_run,
    claim_batch,
    claim_task,
    compact,
    create_run,
    deny,
    heartbeat,
    heartbeat_claim,
    pause_run,
    report_batch,
    resolve_await,
    resume_run,
    retry,
    task_complete,
    task_errored,
    task_fail,
    task_stopped,
)

__all__ = [
    "Conflict",
    "Outcome",
    "claim_batch",
    "heartbeat_claim",
    "report_batch",
    "Forbidden",
    "InvalidRequest",
    "KernelError",
    "NotFound",
    "abandon",
    "answer",
    "append",
    "approve",
    "cancel_run",
    "claim_task",
    "compact",
    "create_run",
    "deny",
    "heartbeat",
    "pause_run",
    "resolve_await",
    "resume_run",
    "retry",
    "task_complete",
    "task_errored",
    "task_fail",
    "task_stopped",
]
