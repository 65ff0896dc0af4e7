"""Celery adapters: ids in, one call. Beat runs `notify.tasks.sweep` (CELERY_BEAT_SCHEDULE)."""

from __future__ import annotations

from celery import shared_task

from notify import digests
from notify.delivery import DeliveryError
from oz0site.sweeps import skipped_while_the_database_is_away


@shared_task(
    name="notify.tasks.deliver_digest",
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=(DeliveryError,),
    max_retries=4,
    retry_backoff=30,
    retry_backoff_max=600,
)
def deliver_digest(subscription_id: int) -> None:
    digests.deliver(subscription_id)


@shared_task(name="notify.tasks.sweep", ignore_result=True)
def sweep() -> None:
    with skipped_while_the_database_is_away("the notifications' sweep"):
        digests.sweep(send=deliver_digest.delay)
