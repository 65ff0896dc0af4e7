"""Per-user request rate limits of the JSON API, in Redis: a fixed window per user and kind.

Two kinds: `write` (every POST and DELETE a person sends) and `read` (the expensive reads: run
lists, traces, the audit trail, findings, scorecards, the inbox). Each is OZ0_RATE_<KIND> requests
per OZ0_RATE_WINDOW_SECONDS; past it the request is refused 429 `rate_limited` with `Retry-After`
(the seconds until the window turns) before its standing is looked up or its body read.

A fixed window is a SET NX EX (the window's first request makes the key, with its expiry) and an
INCR, pipelined: one round trip, on every Redis oz0 runs with (the embedded one is 6.2, which has
no EXPIRE NX). It lets a client burst up to twice the limit across a window's edge, which is harmless for
a limit that exists to bound one member's share, not to meter.
"""

from __future__ import annotations

import logging
import math
import time
from functools import lru_cache
from typing import Any

import redis
from django.conf import settings
from django.db import connection
from redis.backoff import NoBackoff
from redis.retry import Retry

from runs.kernel import KernelError

log = logging.getLogger(__name__)


class RateLimited(KernelError):
    status = 429

    def __init__(self, kind: str, limit: int, window: float, retry_after: int) -> None:
        super().__init__(
            "rate_limited", f"more than {limit} {kind} requests in {window:g} s from you; try again in {retry_after} s"
        )
        self.retry_after = retry_after


# A limit fails open while Redis is away, so asking it must cost a request next to nothing then:
# redis-py retries a failed command three times with backoff by default (some 4 s a call), and
# waits on a host that drops packets for as long as the kernel lets a connect hang.
LIMITER_CONNECT_TIMEOUT = 0.25
LIMITER_TIMEOUT = 0.5


def fail_open_client(url: str) -> redis.Redis:
    """A client for limits and counters that let work through when Redis is away: one attempt
    per command, short timeouts."""
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=LIMITER_CONNECT_TIMEOUT,
        socket_timeout=LIMITER_TIMEOUT,
        retry=Retry(NoBackoff(), 0),
    )


@lru_cache(maxsize=1)
def _client() -> redis.Redis:
    return fail_open_client(settings.REDIS_URL)


def limit_of(kind: str) -> int:
    return int(settings.OZ0_RATE_WRITES if kind == "write" else settings.OZ0_RATE_READS)


def admit(user_id: Any, kind: str) -> None:
    """Count one request of `kind` by the user; RateLimited past the window's limit (0: no limit)."""
    limit = limit_of(kind)
    if limit <= 0:
        return
    window = float(settings.OZ0_RATE_WINDOW_SECONDS)
    now = time.time()
    index = int(now // window)
    # Users are rows of one database: installs (and test sessions) sharing a Redis keep apart.
    key = f"oz0:rate:{connection.settings_dict['NAME']}:{kind}:{user_id}:{index}"
    pipe = _client().pipeline(transaction=False)
    pipe.set(key, 0, ex=math.ceil(window) + 1, nx=True)
    pipe.incr(key)
    try:
        _, count = pipe.execute()
    except redis.RedisError:
        # The limit bounds one member's share; it is no reason to refuse work while Redis is
        # down (a create commits to PostgreSQL and its message is recovered from there).
        log.warning("rate limit not counted: Redis is unreachable")
        return
    if int(count) > limit:
        retry_after = max(1, math.ceil((index + 1) * window - now))
        raise RateLimited(kind, limit, window, retry_after)
