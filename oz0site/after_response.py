"""Work a request leaves for after its response: done in order by one thread of the web process.

Why: a JSON API request's server time is charged to its workspace (oz0site/workspace_rate.py) in
a Redis round trip once the request has taken it. Made on the response's way out, that round
trip was part of every request's latency, and beside a busy neighbour (the machine's cores and
the interpreter shared) it was among the slowest parts of a quiet workspace's slowest reads. The
charge is measured on the request's own thread (its CPU time is that thread's), then handed here.

What stays exact: a workspace's next request in this process waits, before its own admission,
for that workspace's work still on the way (`settled`), so its bucket counts every request this
process answered it before, as when each response waited for its charge. A closed loop's next
request finds its last charge sent or waits the moment left; a quiet workspace's rarely waits at
all. The wait gives up after a second: a Redis that does not answer lets requests through, as
the limits always do when Redis is unreachable. Past MAX_LEFT pieces of work waiting (a Redis
slower than the requests come), a request does its own before it answers: the queue never grows
without bound, and no work is dropped for it (only a process that ends loses what it had left,
as a process killed mid-request loses that request's charge).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)

SETTLE_SECONDS = 1.0
MAX_LEFT = 10_000


class AfterResponse:
    """One thread doing each key's work in the order it was left; `settled` waits for a key's."""

    def __init__(self, max_left: int = MAX_LEFT) -> None:
        self.max_left = max_left
        self._turn = threading.Condition()
        self._work: deque[tuple[object, Callable[[], None]]] = deque()
        self._pending: dict[object, int] = {}
        self._worker: threading.Thread | None = None

    def leave(self, key: object, work: Callable[[], None]) -> None:
        with self._turn:
            queued = len(self._work) < self.max_left
            if queued:
                if self._worker is None:
                    self._worker = threading.Thread(target=self._do_all, name="oz0-after-response", daemon=True)
                    self._worker.start()
                self._work.append((key, work))
                self._pending[key] = self._pending.get(key, 0) + 1
                self._turn.notify_all()
        if not queued:
            work()  # on the caller's own thread, before its response: done, and the queue in bounds

    def settled(self, key: object, timeout: float = SETTLE_SECONDS) -> bool:
        """Whether the key's work left so far is done, waiting for it at most `timeout`."""
        with self._turn:
            return self._turn.wait_for(lambda: key not in self._pending, timeout=timeout)

    def _do_all(self) -> None:
        while True:
            with self._turn:
                self._turn.wait_for(lambda: bool(self._work))
                key, work = self._work.popleft()
            try:
                work()
            except Exception:  # one failed piece of work must not stop the others
                log.warning("work left for after a response failed", exc_info=True)
            finally:
                with self._turn:
                    left = self._pending.get(key, 1) - 1
                    if left > 0:
                        self._pending[key] = left
                    else:
                        self._pending.pop(key, None)
                    self._turn.notify_all()


_process = AfterResponse()


def leave(key: object, work: Callable[[], None]) -> None:
    """Do `work` after the response, in order with everything else left in this process."""
    _process.leave(key, work)


def settled(key: object, timeout: float = SETTLE_SECONDS) -> bool:
    """Whether the work left under `key` in this process is done, waiting for it at most `timeout`."""
    return _process.settled(key, timeout)


def _fresh_in_child() -> None:
    """A forked child has none of its parent's threads: it starts with nothing left to do."""
    global _process
    _process = AfterResponse()


os.register_at_fork(after_in_child=_fresh_in_child)
