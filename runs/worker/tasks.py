"""Celery adapters: ids in, one kernel or execution call, nothing else.

Each task keeps the name it had when this module was `runs.tasks`: queued messages and the beat
schedule (`CELERY_BEAT_SCHEDULE`) name tasks by these strings, not by where the code lives.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import shared_task
from celery.exceptions import Reject
from django.conf import settings

from runs.worker import execution, periodic
from runs.worker.reporting import DatabaseUnavailable


@contextmanager
def requeued_while_the_database_is_away() -> Iterator[None]:
    """A message whose task could not be claimed because the database stayed unreachable (the
    worker waited OZ0_DATABASE_RETRY_SECONDS) goes back to the queue, never acknowledged as failed."""
    try:
        yield
    except DatabaseUnavailable as error:
        raise Reject(str(error), requeue=True) from error


@shared_task(name="runs.tasks.execute_task", acks_late=True, reject_on_worker_lost=True)
def execute_task(task_id: int, run_id: str | None = None) -> None:
    with requeued_while_the_database_is_away():
        execution.execute_shared(task_id, run_id)


# A session its workspace has no room for is sent again after this long.
SESSION_RETRY_SECONDS = 5


@shared_task(name="runs.tasks.execute_session", acks_late=True, reject_on_worker_lost=True, bind=True)
def execute_session(self: Any, task_id: int, run_id: str | None = None) -> None:
    with requeued_while_the_database_is_away():
        started = execution.execute_session(task_id, run_id)
    if not started:
        # Sent again with the message priority it came with (its run's: runs.kernel.priorities).
        priority = (self.request.delivery_info or {}).get("priority")
        options: dict[str, Any] = {"countdown": SESSION_RETRY_SECONDS, "queue": settings.OZ0_SESSION_QUEUE}
        if isinstance(priority, int):
            options["priority"] = priority
        execute_session.apply_async((task_id, run_id), **options)


@shared_task(name="runs.tasks.execute_batch", acks_late=True, reject_on_worker_lost=True)
def execute_batch(task_ids: list[int], run_id: str | None = None) -> None:
    with requeued_while_the_database_is_away():
        execution.execute_batch(task_ids, run_id)


@shared_task(name="runs.tasks.sweep", ignore_result=True)
def sweep() -> None:
    periodic.run_all()


@shared_task(name="runs.tasks.noop", ignore_result=True)
def noop() -> None:
    """Beat's liveness tick; also lets the bench measure bare-Celery no-ops."""
