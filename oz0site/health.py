"""GET /healthz: the database, Redis, the worker heartbeat and beat's sweeps, each with a status.

The page is public (load balancers read it), so a failure says what failed in a fixed word and
never the exception's text (hosts, ports, user names); the text goes to the log.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

log = logging.getLogger(__name__)


def _failed(what: str, error: Exception) -> dict[str, Any]:
    log.warning("healthz: %s check failed: %s: %s", what, type(error).__name__, error)
    return {"status": "error", "detail": f"{what} unreachable"}


def check_database() -> dict[str, Any]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return {"status": "ok"}
    except Exception as error:
        return _failed("database", error)


def check_redis() -> dict[str, Any]:
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=2)
    try:
        client.ping()
        return {"status": "ok"}
    except Exception as error:
        return _failed("redis", error)
    finally:
        client.close()


def _stamp_check(key: str, what: str, nobody: str) -> dict[str, Any]:
    from django.core.cache import cache

    try:
        stamp = cache.get(key)
    except Exception as error:
        return _failed(f"{what} heartbeat (redis)", error)
    if stamp is None:
        return {"status": "unknown", "detail": nobody}
    age = time.time() - float(stamp)
    status = "ok" if age <= float(settings.OZ0_WORKER_STALE_SECONDS) else "stale"
    return {"status": status, "last_seen_seconds_ago": round(age, 1)}


def check_worker() -> dict[str, Any]:
    """A worker of the default queue stamps this from its main process, however busy its slots
    are (runs.worker.periodic.WorkerAlive): stale means no worker is alive, never a long queue."""
    return _stamp_check(settings.OZ0_WORKER_HEARTBEAT_KEY, "worker", "no worker has reported yet")


def check_sweeps() -> dict[str, Any]:
    """Beat's sweeper stamps this at every pass: stale means beat is down (or cannot run its sweeps)."""
    return _stamp_check(settings.OZ0_SWEEP_HEARTBEAT_KEY, "sweeps", "no sweep has run yet")


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    checks = {"database": check_database(), "redis": check_redis(), "worker": check_worker(), "sweeps": check_sweeps()}
    healthy = checks["database"]["status"] == "ok" and checks["redis"]["status"] == "ok"
    working = checks["worker"]["status"] == "ok" and checks["sweeps"]["status"] == "ok"
    status = "ok" if healthy and working else ("degraded" if healthy else "error")
    return JsonResponse({"status": status, "checks": checks}, status=200 if healthy else 503)
