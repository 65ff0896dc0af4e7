"""The web process's handler runs a request's middleware and its synchronous view in one thread,
entered once from the event loop (oz0site/web_handler.py); a coroutine view still runs on the loop."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from asgiref import sync
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.core.handlers.asgi import ASGIHandler

from oz0site.web_handler import OneThreadASGIHandler


async def _get(application: Any, path: str) -> tuple[int, bytes]:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 40000),
        "server": ("testserver", 80),
    }
    communicator = ApplicationCommunicator(application, scope)
    await communicator.send_input({"type": "http.request", "body": b""})
    start = await communicator.receive_output(10)
    body = b""
    while True:
        message = await communicator.receive_output(10)
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await communicator.wait(10)
    return start["status"], body


def _event_loop_entries(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each time a request's thread handed work back to the event loop."""
    entries: list[int] = []
    enter = sync.AsyncToSync.__call__

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.awaitable is not _get:  # the test's own way in
            entries.append(1)
        return enter(self, *args, **kwargs)

    monkeypatch.setattr(sync.AsyncToSync, "__call__", counted)
    return entries


@pytest.mark.django_db(transaction=True)
def test_a_synchronous_views_request_never_goes_back_to_the_event_loop_before_its_response(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Django's own ASGI handler, with oz0's synchronous middleware, went from the request's thread
    back to the event loop to call the view, and from there into the thread again."""
    path = f"/api/v1/runs/{uuid.uuid4()}"
    entries = _event_loop_entries(monkeypatch)
    status, body = async_to_sync(_get)(ASGIHandler(), path)
    assert status == 401 and len(entries) >= 1  # the way it was
    entries.clear()
    status, body = async_to_sync(_get)(OneThreadASGIHandler(), path)
    assert status == 401 and b"error" in body
    assert entries == []


@pytest.mark.django_db(transaction=True)
def test_a_coroutine_view_still_runs_on_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    entries = _event_loop_entries(monkeypatch)
    status, body = async_to_sync(_get)(OneThreadASGIHandler(), f"/api/v1/runs/{uuid.uuid4()}/wait")
    assert status == 401 and b"error" in body
    assert len(entries) == 1  # the long poll, on the loop, its thread waiting for it
