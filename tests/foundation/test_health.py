"""GET /healthz: the database, Redis and the worker heartbeat, each with a status."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client, override_settings

from tests.conftest import LiveStack, wait_for
from tests.foundation.helpers import closed_port


def health() -> tuple[int, dict[str, Any]]:
    response = Client().get("/healthz")
    return response.status_code, response.json()


@pytest.mark.live
def test_it_reports_database_redis_and_worker_ok_with_a_live_worker(live: LiveStack) -> None:
    status, body = wait_for(
        lambda: (lambda r: r if r[1]["checks"]["worker"]["status"] == "ok" else None)(health()),
        timeout=30,
        message="a worker heartbeat",
    )
    assert status == 200
    assert body["status"] == "ok"
    assert body["checks"]["database"] == {"status": "ok"}
    assert body["checks"]["redis"] == {"status": "ok"}
    assert 0 <= body["checks"]["worker"]["last_seen_seconds_ago"] < 30


@pytest.mark.django_db
def test_it_reports_an_unknown_worker_as_degraded() -> None:
    with override_settings(OZ0_WORKER_HEARTBEAT_KEY="oz0:worker-heartbeat:nobody-listens-here"):
        status, body = health()
    assert status == 200
    assert body["status"] == "degraded"
    assert body["checks"]["worker"]["status"] == "unknown"


@pytest.mark.django_db
def test_it_reports_an_unreachable_redis_as_an_error() -> None:
    port = closed_port()
    url = f"redis://127.0.0.1:{port}/0"
    caches = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": url}}
    with override_settings(REDIS_URL=url, CACHES=caches):
        status, body = health()
    assert status == 503
    assert body["status"] == "error"
    assert body["checks"]["database"] == {"status": "ok"}
    assert body["checks"]["redis"] == {"status": "error", "detail": "redis unreachable"}
    assert body["checks"]["worker"]["status"] == "error"
    # A public page: no exception text, no host or port.
    text = json.dumps(body)
    assert str(port) not in text and "127.0.0.1" not in text and "Error" not in text and "refused" not in text


def test_it_answers_only_get(client: Client, db: Any) -> None:
    assert client.post("/healthz").status_code == 405


@pytest.mark.django_db
def test_it_keeps_a_database_errors_text_off_the_public_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, the exception's text (hosts, users) went out in `detail` to anyone who asked."""

    class Broken:
        def cursor(self) -> Any:
            raise RuntimeError('connection to server at "db.internal" (10.0.0.7), port 5432 failed: password for "oz0_admin"')

    monkeypatch.setattr("oz0site.health.connection", Broken())
    status, body = health()
    assert status == 503
    assert body["checks"]["database"] == {"status": "error", "detail": "database unreachable"}
    assert "db.internal" not in json.dumps(body) and "oz0_admin" not in json.dumps(body)
