"""The periodic sweeps beat runs: expired claims, lost messages, clocks, and the worker heartbeat."""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.core.cache import cache

from runs.kernel import sweeps as kernel_sweeps

log = logging.getLogger(__name__)


def broker_queue_empty() -> bool:
    import redis

    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    try:
        return int(client.llen(settings.CELERY_TASK_DEFAULT_QUEUE)) == 0
    finally:
        client.close()


def record_worker_heartbeat() -> None:
    cache.set(settings.OZ0_WORKER_HEARTBEAT_KEY, time.time(), timeout=3600)


def run_all() -> None:
    record_worker_heartbeat()
    for name, sweep in (
        ("claims", kernel_sweeps.sweep_expired_claims),
        ("clocks", kernel_sweeps.sweep_clocks),
    ):
        try:
            sweep()
        except Exception:
            log.exception("the %s sweep failed", name)
    try:
        kernel_sweeps.sweep_lost_messages(broker_queue_empty=broker_queue_empty())
    except Exception:
        log.exception("the lost-message sweep failed")
    try:
        from runs import executors

        executors.sweep_expired_leases()
    except ImportError:
        pass
    except Exception:
        log.exception("the executor lease sweep failed")
    try:
        from runs.kernel import executors as kernel_executors

        kernel_executors.sweep_unserved_calls()
    except Exception:
        log.exception("the unserved-call sweep failed")
