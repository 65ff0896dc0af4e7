"""Celery adapter: beat sends `schedules.tasks.fire_due` (CELERY_BEAT_SCHEDULE); the firing is
schedules/firing.py's, safe to run twice at once. `schedules.tasks.prune`: retention of firings
and deliveries (schedules/retention.py)."""

from __future__ import annotations

from celery import shared_task

from oz0site.sweeps import skipped_while_the_database_is_away
from schedules import firing, retention


@shared_task(name="schedules.tasks.fire_due", ignore_result=True)
def fire_due() -> None:
    with skipped_while_the_database_is_away("firing due schedules"):
        firing.fire_due()


@shared_task(name="schedules.tasks.prune", ignore_result=True)
def prune() -> None:
    with skipped_while_the_database_is_away("pruning firings and deliveries"):
        retention.prune()
