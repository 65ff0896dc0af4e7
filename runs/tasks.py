"""Celery adapters: ids in, one kernel or execution call, nothing else."""

from __future__ import annotations

from celery import shared_task

from runs import execution, sweeps


@shared_task(name="runs.tasks.execute_task", acks_late=True, reject_on_worker_lost=True)
def execute_task(task_id: int, run_id: str | None = None) -> None:
    execution.execute_task(task_id, run_id)


@shared_task(name="runs.tasks.execute_batch", acks_late=True, reject_on_worker_lost=True)
def execute_batch(task_ids: list[int], run_id: str | None = None) -> None:
    execution.execute_batch(task_ids, run_id)


@shared_task(name="runs.tasks.sweep", ignore_result=True)
def sweep() -> None:
    sweeps.run_all()


@shared_task(name="runs.tasks.noop", ignore_result=True)
def noop() -> None:
    """Beat's liveness tick; also lets the bench measure bare-Celery no-ops."""
