"""Celery adapter: beat sends `insights.tasks.sweep_rollouts` (CELERY_BEAT_SCHEDULE); the sweep is
insights/canary.py's, safe to run twice at once (each rollback under the agent's row lock)."""

from __future__ import annotations

from celery import shared_task

from insights import canary
from oz0site.sweeps import skipped_while_the_database_is_away


@shared_task(name="insights.tasks.sweep_rollouts", ignore_result=True)
def sweep_rollouts() -> None:
    with skipped_while_the_database_is_away("the rollouts' sweep"):
        canary.sweep()
