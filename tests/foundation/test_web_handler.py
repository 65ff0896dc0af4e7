"""The web process's handler runs a request's middleware and its synchronous view in one thread,
entered once from the event loop (oz0site/web_handler.py); a coroutine view still runs on the loop;
the threads are the process's own, kept and reused, never started by the loop per request."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from asgiref import sync
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.core.handlers.asgi import ASGIHandler

from oz0site.web_handler import OneThreadASGIHandler, RequestThreads
from tests.conftest import wait_for


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


def _thread_starts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of each thread started from now on."""
    started: list[str] = []
    start = threading.Thread.start

    def counted(self: threading.Thread) -> None:
        started.append(self.name)
        start(self)

    monkeypatch.setattr(threading.Thread, "start", counted)
    return started


def _view_threads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The thread each request's middleware ran in."""
    seen: list[int] = []
    chain = OneThreadASGIHandler.load_middleware

    def load(self: Any, is_async: bool = False) -> None:
        chain(self, is_async)
        inner = self._middleware_chain.func

        def noted(request: Any) -> Any:
            seen.append(threading.get_ident())
            return inner(request)

        self._middleware_chain = sync.sync_to_async(noted, thread_sensitive=True)

    monkeypatch.setattr(OneThreadASGIHandler, "load_middleware", load)
    return seen


@pytest.mark.django_db(transaction=True)
def test_requests_run_in_threads_the_process_keeps_and_the_event_loop_starts_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """Django's handler started a thread for each request and another to join it, each start a
    stall of the event loop while the new thread won the interpreter lock."""
    path = f"/api/v1/runs/{uuid.uuid4()}"
    started = _thread_starts(monkeypatch)

    async def threads_started_by_four_more(application: Any) -> int:
        """Threads started while four requests follow a first one (which may start what it needs)."""
        assert (await _get(application, path))[0] == 401
        before = len(started)
        for _ in range(4):
            assert (await _get(application, path))[0] == 401
        return len(started) - before

    assert async_to_sync(threads_started_by_four_more)(ASGIHandler()) >= 8  # the way it was: two a request
    seen = _view_threads(monkeypatch)
    handler = OneThreadASGIHandler()
    assert async_to_sync(threads_started_by_four_more)(handler) == 0
    # One thread, started for the first request and kept: each later request ran in it.
    assert handler.threads.started() == 1 and len(seen) == 5 and len(set(seen)) == 1


def test_a_thread_still_busy_with_an_abandoned_request_is_not_lent_to_the_next() -> None:
    threads = RequestThreads()
    first = threads.take()
    release = threading.Event()
    first.submit(release.wait, 10)  # a view still running, its client gone
    threads.give_back(first)
    assert threads.idle() == 0
    second = threads.take()
    assert second is not first
    release.set()
    wait_for(lambda: threads.idle() == 1, timeout=10, interval=0.01, message="the first thread idle again")
    assert threads.take() is first
    for executor in (first, second):
        executor.shutdown()


def test_idle_threads_past_the_keep_are_let_go() -> None:
    threads = RequestThreads(keep=1)
    taken = [threads.take() for _ in range(3)]
    workers = [executor.submit(threading.current_thread).result() for executor in taken]
    for executor in taken:
        threads.give_back(executor)
    wait_for(
        lambda: threads.idle() == 1 and sum(worker.is_alive() for worker in workers) == 1,
        timeout=10,
        interval=0.01,
        message="one idle thread kept, the others ended",
    )
    assert threads.started() == 3
    threads.take().shutdown()
