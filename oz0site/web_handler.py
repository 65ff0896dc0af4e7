"""The web process's HTTP handler: a request's middleware and its view in one thread, entered once.

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
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler


class OneThreadASGIHandler(ASGIHandler):
    _middleware_chain: Any  # Django's, built by load_middleware

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)
        self._middleware_chain = sync_to_async(self._middleware_chain, thread_sensitive=True)
