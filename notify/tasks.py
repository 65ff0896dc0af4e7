"""Celery adapters: ids in, one call. Beat runs `notify.tasks.sweep` and `notify.tasks.sweep_deadlines`
(CELERY_BEAT_SCHEDULE)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from notify import deadlines, digests
from notify.delivery import DeliveryError
from oz0site.sweeps import skipped_while_the_database_is_away

# Both deliveries (a digest, a deadline's notice) alike: acknowledged once done, so a lost worker's
# delivery is sent again, and retried with backoff while a channel refuses it.
DELIVERY: dict[str, Any] = {
    "acks_late": True,
    "reject_on_worker_lost": True,
    "autoretry_for": (DeliveryError,),
    "max_retries": 4,
    "retry_backoff": 30,
    "retry_backoff_max": 600,
}


@shared_task(name="notify.tasks.deliver_digest", **DELIVERY)
def deliver_digest(subscription_id: int) -> None:
    digests.deliver(subscription_id)


@shared_task(name="notify.tasks.sweep", ignore_result=True)
def sweep() -> None:
    with skipped_while_the_database_is_away("the notifications' sweep"):
        digests.sweep(send=deliver_digest.delay)


@shared_task(name="notify.tasks.deliver_notice", **DELIVERY)
def deliver_notice(notice_id: int) -> None:
    deadlines.deliver(notice_id)


@shared_task(name="notify.tasks.sweep_deadlines", ignore_result=True)
def sweep_deadlines() -> None:
    with skipped_while_the_database_is_away("the wait deadlines' sweep"):
        deadlines.sweep(send=deliver_notice.delay)
