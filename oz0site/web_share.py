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

**Quiet first.** A share bounds how many of a busy workspace's requests run at once, but those
few still share the interpreter with a quiet neighbour's request for as long as it runs, and a
busy workspace replaces each one that ends at once. So a request of a workspace with nothing else
in flight in this process (a *quiet* request) goes first: while one runs, another workspace's
request that would be its own workspace's second or later in flight waits (up to
OZ0_WEB_QUIET_FIRST_SECONDS, so a stream of quiet workspaces cannot starve a busy one), and the
quiet request shares the interpreter only with what was already running when it came.
"""

from __future__ import annotations

import threading
import time
from collections import deque
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
    # The waiting requests in arrival order: only the first may take a slot that comes free.
    queue: deque[object] = field(default_factory=deque)


_shares: dict[int, _Share] = {}
# Per workspace: its running requests that came when it had nothing else in flight (quiet ones).
_quiet: dict[int, int] = {}


def in_use(workspace_id: int) -> tuple[int, int]:
    """(running, waiting) requests of the workspace in this process."""
    with _lock:
        share = _shares.get(workspace_id)
        return (share.running, share.waiting) if share else (0, 0)


def _another_quiet(workspace_id: int) -> bool:
    return any(count > 0 for other, count in _quiet.items() if other != workspace_id)


def take(request: HttpRequest, workspace_id: int) -> None:
    """Run the request within the workspace's share, waiting for a turn; WorkspaceBusy past the wait."""
    slots = int(settings.OZ0_WEB_SLOTS_PER_WORKSPACE)
    if slots <= 0 or getattr(request, SHARE_ATTRIBUTE, None) is not None:
        return
    waited = float(settings.OZ0_WEB_SLOT_WAIT_SECONDS)
    quiet_first = max(0.0, float(settings.OZ0_WEB_QUIET_FIRST_SECONDS))
    started = time.monotonic()
    quiet_until = started + quiet_first
    with _lock:
        share = _shares.setdefault(workspace_id, _Share())
        if share.running == 0 and share.waiting == 0:
            _admit(request, workspace_id, share, quiet=quiet_first > 0)
            return
        if share.running < slots and (quiet_first <= 0 or not _another_quiet(workspace_id)):
            _admit(request, workspace_id, share, quiet=False)
            return
        share.waiting += 1
        ticket = object()
        share.queue.append(ticket)
    # The pool's connection goes back while this request holds nothing but a thread (inside a
    # transaction it stays: closing would doom the transaction).
    if not connection.in_atomic_block:
        connection.close()
    with _lock:
        try:
            while True:
                now = time.monotonic()
                first = share.queue[0] is ticket
                if first and share.running < slots and (now >= quiet_until or not _another_quiet(workspace_id)):
                    admitted = True
                    break
                if now >= started + waited:
                    admitted = False
                    break
                # Woken by its own workspace's slot coming free, the request ahead of it leaving the
                # queue or another's quiet request ending; else at the end of the quiet-first wait,
                # or of the whole wait.
                wake_at = started + waited if not first or share.running >= slots or now >= quiet_until else quiet_until
                share.turn.wait(timeout=max(0.0, wake_at - now))
        finally:
            share.waiting -= 1
            share.queue.remove(ticket)
            share.turn.notify_all()  # the next in line looks again
        if not admitted:
            _forget_if_idle(workspace_id, share)
            raise WorkspaceBusy(waited)
        _admit(request, workspace_id, share, quiet=False)


def _admit(request: HttpRequest, workspace_id: int, share: _Share, *, quiet: bool) -> None:
    share.running += 1
    if quiet:
        _quiet[workspace_id] = _quiet.get(workspace_id, 0) + 1
    setattr(request, SHARE_ATTRIBUTE, (workspace_id, quiet))


def give_back(request: HttpRequest) -> None:
    held = getattr(request, SHARE_ATTRIBUTE, None)
    if held is None:
        return
    setattr(request, SHARE_ATTRIBUTE, None)
    workspace_id, quiet = held
    slots = max(1, int(settings.OZ0_WEB_SLOTS_PER_WORKSPACE))
    with _lock:
        if quiet:
            left = _quiet.get(workspace_id, 0) - 1
            if left > 0:
                _quiet[workspace_id] = left
            else:
                _quiet.pop(workspace_id, None)
                # Other workspaces' requests held back for this one may go (their own order kept).
                for other_id, other in _shares.items():
                    if other_id != workspace_id and other.waiting and other.running < slots:
                        other.turn.notify_all()
        share = _shares.get(workspace_id)
        if share is None:
            return
        share.running -= 1
        share.turn.notify_all()
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
