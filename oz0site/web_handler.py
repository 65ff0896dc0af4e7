"""The web process's HTTP handler: a request's middleware and its view in one thread, entered once;
the threads kept and reused, request after request.

Django's ASGI handler builds its middleware chain for the event loop. Every middleware of oz0 is
synchronous, so Django wraps the chain in a thread and its innermost step (resolving the URL,
calling the view) back into the event loop, and a synchronous view into the thread again: a
request crossed between the event loop and its thread four times, where two do. Each crossing
waits for the event loop's next turn, and one web process's event loop also reads every request's
body and hands every push to its sockets: beside a busy workspace, those turns are where a quiet
workspace's reads spent the largest part of their time.

So the chain is built synchronous, as under WSGI, and the event loop enters it in the request's
own thread (`sync_to_async`, thread-sensitive: Django gives each request a thread of its own)
and is answered once it has the response. A view that is a coroutine (the `/wait` long poll) runs
on the event loop as before (`async_to_sync` from that thread, the thread waiting for it, which it
did before too: the synchronous middleware around it held it).

**Why the threads are reused.** Django gives each request a thread of its own by starting one
(asgiref's `ThreadSensitiveContext`: a new single-thread executor per request) and, at the
request's end, a second thread to join the first. Starting a thread blocks the event loop until
the new thread has run: it has to win the interpreter lock from the request threads running at
that moment (up to a switch interval, 5 ms, each), then hand it back to the loop. Beside a busy
workspace that was two stalls of the whole event loop per request, everyone's. Each request here
still runs alone in a thread that is its own while it runs (Django's thread-sensitive promise),
but one the process started before and keeps (`RequestThreads`): the loop starts no thread and
joins none. A quiet workspace's read, from reaching the handler to starting in its thread, at
p95 beside the neighbors bench's noise: 8.6, 11.2 and 12.8 ms with a thread started per request,
7.1, 8.0 and 9.1 ms with the threads reused (alone, 2.5 to 4 ms either way).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core.handlers.asgi import ASGIHandler

# Idle threads kept beyond this are let go: what a burst of requests in flight at once started.
KEEP_IDLE_THREADS = 64


class RequestThread(ThreadPoolExecutor):
    """One thread that runs one request's work at a time, counting what it has still to run."""

    def __init__(self, name: str) -> None:
        super().__init__(max_workers=1, thread_name_prefix=name)
        self._count = threading.Lock()
        self.pending = 0
        self._when_idle: Callable[[RequestThread], None] | None = None

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        with self._count:
            self.pending += 1
        future = super().submit(fn, *args, **kwargs)
        # Added before the caller's own callbacks: by the time the event loop hears the result,
        # the count is down.
        future.add_done_callback(self._one_done)
        return future

    def _one_done(self, _future: Future[Any]) -> None:
        with self._count:
            self.pending -= 1
            then = self._when_idle if self.pending == 0 else None
            if then is not None:
                self._when_idle = None
        if then is not None:
            then(self)

    def when_idle(self, then: Callable[[RequestThread], None]) -> None:
        with self._count:
            if self.pending:
                self._when_idle = then
                return
        then(self)


class RequestThreads:
    """Request threads, each a request's own while it runs, lent again once idle."""

    def __init__(self, keep: int = KEEP_IDLE_THREADS) -> None:
        self.keep = keep
        self._idle: deque[RequestThread] = deque()
        self._started = 0

    def take(self) -> RequestThread:
        """(The event loop's thread, the only caller.)"""
        try:
            return self._idle.pop()
        except IndexError:
            self._started += 1
            return RequestThread(f"oz0-request-{self._started}")

    def give_back(self, thread: RequestThread) -> None:
        # Lent again once it has nothing left to run: a request whose client went away mid-view
        # leaves the view running there, and the next request must not queue behind it.
        thread.when_idle(self._settle)

    def _settle(self, thread: RequestThread) -> None:
        if len(self._idle) < self.keep:
            self._idle.append(thread)
        else:
            thread.shutdown(wait=False)

    def idle(self) -> int:
        return len(self._idle)

    def started(self) -> int:
        return self._started


class OneThreadASGIHandler(ASGIHandler):
    _middleware_chain: Any  # Django's, built by load_middleware

    def __init__(self) -> None:
        super().__init__()
        self.threads = RequestThreads()

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)
        self._middleware_chain = sync_to_async(self._middleware_chain, thread_sensitive=True)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        executor = self.threads.take()
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.handle(scope, receive, send)
        finally:
            self.threads.give_back(executor)
