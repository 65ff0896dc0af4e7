"""What beat runs every OZ0_SWEEP_SECONDS: the worker heartbeat, then each kernel sweep
(expired claims, clocks, lost messages, executor leases, unserved runner calls, a child's lost
settle or cancel).

A sweep that fails is logged and the others still run; the next pass tries it again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import redis
from django.conf import settings
from django.core.cache import cache

from runs import kernel

log = logging.getLogger(__name__)


def broker_queue_empty() -> bool:
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    try:
        queues = (settings.CELERY_TASK_DEFAULT_QUEUE, settings.OZ0_SESSION_QUEUE)
        return all(int(client.llen(queue)) == 0 for queue in queues)
    finally:
        client.close()


def record_worker_heartbeat() -> None:
    cache.set(settings.OZ0_WORKER_HEARTBEAT_KEY, time.time(), timeout=3600)


def _lost_messages() -> object:
    return kernel.sweep_lost_messages(broker_queue_empty=broker_queue_empty())


SWEEPS: tuple[tuple[str, Callable[[], object]], ...] = (
    ("claims", kernel.sweep_expired_claims),
    ("clocks", kernel.sweep_clocks),
    ("lost-message", _lost_messages),
    ("executor lease", kernel.sweep_expired_leases),
    ("unserved-call", kernel.sweep_unserved_calls),
    ("delegation", kernel.sweep_delegations),
)


def run_all() -> None:
    record_worker_heartbeat()
    for name, sweep in SWEEPS:
        try:
            sweep()
        except Exception:
            log.exception("the %s sweep failed", name)
