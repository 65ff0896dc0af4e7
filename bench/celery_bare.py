"""Bare Celery: `runs.tasks.noop` through the same broker, queue settings and worker processes as oz0.

The bench process sends `n` no-op messages one `delay()` at a time (as the kernel sends its
`execute_task` messages) and the clock stops when the queue is empty and no message of the
queue is left unacknowledged (the workers run `acks_late`, so a message leaves kombu's
`unacked` hash only once its task has returned).
"""

from __future__ import annotations

import json
import time
from typing import Any

from bench.harness import wait_until


def _in_flight(client: Any, queue: str) -> bool:
    if client.llen(queue):
        return True
    for raw in client.hvals("unacked"):
        try:
            if json.loads(raw)[2] == queue:
                return True
        except (ValueError, IndexError, TypeError):
            continue
    return False


def drained(redis_url: str, queue: str, *, timeout: float = 600.0) -> float:
    """Wait until nothing of `queue` is queued or unacknowledged; returns the time it first was so.

    kombu moves a message from the list to the unacked hash in two steps, so the queue must
    look empty on three polls in a row before it counts as drained.
    """
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        seen_empty: float | None = None
        streak = 0

        def settled() -> bool:
            nonlocal seen_empty, streak
            now = time.time()
            if _in_flight(client, queue):
                seen_empty, streak = None, 0
                return False
            if seen_empty is None:
                seen_empty = now
            streak += 1
            return streak >= 3

        wait_until(settled, timeout=timeout, interval=0.005, what=f"the Celery queue {queue} to drain")
        assert seen_empty is not None
        return seen_empty
    finally:
        client.close()


def measure(n: int, redis_url: str, queue: str) -> dict[str, float]:
    """Send `n` no-ops and wait for the workers to run them all: tasks per second end to end."""
    from runs.worker.tasks import noop

    started = time.time()
    for _ in range(n):
        noop.delay()
    sent = time.time()
    finished = drained(redis_url, queue)
    seconds = finished - started
    return {"seconds": seconds, "tasks_per_s": n / seconds, "send_seconds": sent - started}
