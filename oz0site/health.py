"""GET /healthz: the database, Redis and the worker heartbeat, each with a status.

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

WORKER_STALE_SECONDS = 30.0

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


def check_worker() -> dict[str, Any]:
    from django.core.cache import cache

    try:
        beat = cache.get(settings.OZ0_WORKER_HEARTBEAT_KEY)
    except Exception as error:
        return _failed("worker heartbeat (redis)", error)
    if beat is None:
        return {"status": "unknown", "detail": "no worker has reported yet"}
    age = time.time() - float(beat)
    status = "ok" if age <= WORKER_STALE_SECONDS else "stale"
    return {"status": status, "last_seen_seconds_ago": round(age, 1)}


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    checks = {"database": check_database(), "redis": check_redis(), "worker": check_worker()}
    healthy = checks["database"]["status"] == "ok" and checks["redis"]["status"] == "ok"
    status = "ok" if healthy and checks["worker"]["status"] == "ok" else ("degraded" if healthy else "error")
    return JsonResponse({"status": status, "checks": checks}, status=200 if healthy else 503)
