"""Each workspace's share of a web process: at most OZ0_WEB_SLOTS_PER_WORKSPACE of its requests
run at once in one process; the rest wait their turn, in arrival order, behind their own.

Why: one web process serves every workspace, and Python runs one thread at a time. A workspace
whose members send requests without pause would otherwise have dozens running at once, and a
quiet workspace's request would get a dozenth of the process (and the event loop that forwards
live pushes, which shares the same interpreter lock, as little). With the share, a burst queues
behind itself: another workspace's request competes with a few of the burst's, never with all.

The share is taken once the caller's standing in the workspace is known (oz0site.auth.Route), so
only the workspace's own members fill its queue: an outsider's requests for its run ids are 404s
that never wait in it. A request that waits gives its database connection back first (the web
process's pool is shared too) and gives up after OZ0_WEB_SLOT_WAIT_SECONDS with 503
`workspace_busy` and `Retry-After`. Long waits (`/wait`) take no share: they hold no thread busy.
`WebShareMiddleware` gives the share back when the response is made, whatever the ending.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse

from runs.kernel import KernelError

SHARE_ATTRIBUTE = "_oz0_web_share"


class WorkspaceBusy(KernelError):
    status = 503

    def __init__(self, waited: float) -> None:
        super().__init__(
            "workspace_busy",
            f"this workspace's requests filled its share of the server for {waited:g} s; try again shortly",
        )
        self.retry_after = max(1, round(waited / 10))


_lock = threading.Lock()


@dataclass
class _Share:
    running: int = 0
    waiting: int = 0
    turn: threading.Condition = field(default_factory=lambda: threading.Condition(_lock))


_shares: dict[int, _Share] = {}


def in_use(workspace_id: int) -> tuple[int, int]:
    """(running, waiting) requests of the workspace in this process."""
    with _lock:
        share = _shares.get(workspace_id)
        return (share.running, share.waiting) if share else (0, 0)


def take(request: HttpRequest, workspace_id: int) -> None:
    """Run the request within the workspace's share, waiting for a turn; WorkspaceBusy past the wait."""
    slots = int(settings.OZ0_WEB_SLOTS_PER_WORKSPACE)
    if slots <= 0 or getattr(request, SHARE_ATTRIBUTE, None) is not None:
        return
    waited = float(settings.OZ0_WEB_SLOT_WAIT_SECONDS)
    with _lock:
        share = _shares.setdefault(workspace_id, _Share())
        if share.running < slots:
            share.running += 1
            setattr(request, SHARE_ATTRIBUTE, workspace_id)
            return
        share.waiting += 1
    # The pool's connection goes back while this request holds nothing but a thread (inside a
    # transaction it stays: closing would doom the transaction).
    if not connection.in_atomic_block:
        connection.close()
    with _lock:
        try:
            admitted = share.turn.wait_for(lambda: share.running < slots, timeout=waited)
        finally:
            share.waiting -= 1
        if not admitted:
            _forget_if_idle(workspace_id, share)
            raise WorkspaceBusy(waited)
        share.running += 1
    setattr(request, SHARE_ATTRIBUTE, workspace_id)


def give_back(request: HttpRequest) -> None:
    workspace_id = getattr(request, SHARE_ATTRIBUTE, None)
    if workspace_id is None:
        return
    setattr(request, SHARE_ATTRIBUTE, None)
    with _lock:
        share = _shares.get(workspace_id)
        if share is None:
            return
        share.running -= 1
        share.turn.notify()
        _forget_if_idle(workspace_id, share)


def _forget_if_idle(workspace_id: int, share: _Share) -> None:
    if share.running <= 0 and share.waiting <= 0:
        _shares.pop(workspace_id, None)


class WebShareMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        try:
            return self.get_response(request)
        finally:
            give_back(request)
