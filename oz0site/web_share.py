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
busy workspace replaces each one that ends at once. So a request of a *quiet* workspace goes
first: while one runs, another workspace's request that is not quiet and would be its second or
later in flight waits (up to OZ0_WEB_QUIET_FIRST_SECONDS, so a stream of quiet workspaces cannot
starve a busy one), and the quiet request shares the interpreter only with what was already
running when it came.

A workspace is quiet while its requests kept less than QUIET_BELOW of a request in flight in this
process on average lately (a decaying average with a time constant of OCCUPANCY_SECONDS): a
person's clicks, a program that polls now and then. Quiet once meant "nothing else of its
workspace in flight", and a script sending one request the moment the last was answered had
every request quiet, while a person whose page and its fragment came together had the second
held back behind the script's (the bench's quiet reads went from 17 to 38 ms at p95 beside such
a loop of creates, and from 16 to 26 ms once quiet meant this). A closed loop keeps
about one request in flight all the time: it crosses the line within a few seconds and stays
over it while it keeps going, where a person stays far below. A workspace with a request waiting
for its share is not quiet either, whatever its average: it has filled its share now (a newcomer's
burst, its average still near nothing, went first for its first second or so).

**What was already running yields too.** Held back at the door, a busy workspace's requests in
flight still ran beside the quiet one: with two of them, the quiet request had a third of the
interpreter. So a request that is not quiet pauses before its next database query while another
workspace's quiet request runs, until that one ends, and for at most OZ0_WEB_QUIET_FIRST_SECONDS
over its whole life (a stream of quiet requests cannot starve it). The pause is taken between
queries, never inside one, and charged to no one's server time (it uses no CPU and no query).
A push being handed to a quiet workspace's sockets counts as a quiet request for
QUIET_PUSH_SECONDS: the event loop that hands it on needs the interpreter too.

**A busy workspace beside neighbours runs one request at a time.** Quiet first acts only while a
quiet request runs in its thread, and only between a busy request's queries. But a quiet request
also crosses the event loop before and after (its body read, its response written), and the loop
loses the interpreter to every running request thread at each of its system calls, then waits a
switch interval (5 ms) to have it back: beside the neighbors bench's noise the loop's callbacks
took 6 ms of wall time for 0.6 ms of CPU. Each busy request thread is one more that takes it. So
a workspace that is not quiet runs OZ0_WEB_BUSY_SLOTS requests at once (one) while another
workspace has a request in the process or had one in the last NEIGHBOUR_SECONDS; alone, it has its
whole share, and a quiet workspace always has its whole share (one slot for everyone was tried:
a quiet workspace's page and its fragment then queued behind each other). Its other requests wait
in its own queue as for a full share. The neighbors bench, three pairs alternated: the quiet
read's p95 beside 24.9-33.5 ms against 39.0-51.8 with the whole share, and the busy workspace
itself was served more, not less (its 20-call runs created: 99-149 against 38-52).
"""

from __future__ import annotations

import math
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
# Per workspace: its running requests admitted as quiet ones.
_quiet: dict[int, int] = {}
# Notified whenever a workspace's last quiet request ends: what paused for it looks again.
_quiet_ended = threading.Condition(_lock)
# On a request: how many seconds it may still pause for other workspaces' quiet requests.
PAUSE_ATTRIBUTE = "_oz0_quiet_pause_left"

# A workspace is quiet in this process while its requests kept less than QUIET_BELOW of a request
# in flight on average lately (a decaying average with a time constant of OCCUPANCY_SECONDS).
QUIET_BELOW = 0.4
OCCUPANCY_SECONDS = 5.0
# A workspace with nothing in flight whose average fell below this is forgotten.
FORGOTTEN_BELOW = 0.01
# How long after its last request a workspace still counts as another's neighbour in this process
# (kept that long before it is forgotten).
NEIGHBOUR_SECONDS = 5.0
# How often a request held to a busy workspace's share looks whether its neighbours have left.
BUSY_RECHECK_SECONDS = 1.0


@dataclass
class _Occupancy:
    """How many of a workspace's requests are in flight, and on average lately."""

    in_flight: int = 0
    average: float = 0.0
    at: float = 0.0
    # When a request of the workspace last came or left.
    seen: float = 0.0

    def advance(self, now: float) -> float:
        """The average at `now`: what was in flight since the last change weighs in, decaying."""
        if now > self.at:
            kept = math.exp(-(now - self.at) / OCCUPANCY_SECONDS)
            self.average = self.average * kept + self.in_flight * (1.0 - kept)
            self.at = now
        return self.average


_occupancy: dict[int, _Occupancy] = {}
# When forgotten workspaces were last looked for (at most once per OCCUPANCY_SECONDS).
_forgotten_at = 0.0


def in_use(workspace_id: int) -> tuple[int, int]:
    """(running, waiting) requests of the workspace in this process."""
    with _lock:
        share = _shares.get(workspace_id)
        return (share.running, share.waiting) if share else (0, 0)


def _is_quiet(workspace_id: int, now: float) -> bool:
    """(Under the lock.) Whether the workspace's requests kept less than QUIET_BELOW in flight lately,
    and none of them waits for its share: a workspace that filled its share is busy now, whatever
    its past (a newcomer's burst was quiet for its first second or so, the average still low)."""
    share = _shares.get(workspace_id)
    if share is not None and share.waiting > 0:
        return False
    held = _occupancy.get(workspace_id)
    return held is None or held.advance(now) < QUIET_BELOW


def _in_flight(workspace_id: int, change: int, now: float) -> None:
    """(Under the lock.) Count a request of the workspace in (1) or out (-1) of flight."""
    held = _occupancy.setdefault(workspace_id, _Occupancy(at=now))
    held.advance(now)
    held.in_flight += change
    held.seen = now
    global _forgotten_at
    if change < 0 and now - _forgotten_at >= OCCUPANCY_SECONDS:
        _forgotten_at = now
        for other, each in list(_occupancy.items()):
            idle = each.in_flight == 0 and now - each.seen >= NEIGHBOUR_SECONDS
            if idle and each.advance(now) < FORGOTTEN_BELOW:
                del _occupancy[other]


def _has_neighbour(workspace_id: int, now: float) -> bool:
    """(Under the lock.) Whether another workspace has a request in this process, or had one in
    the last NEIGHBOUR_SECONDS."""
    return any(
        other != workspace_id and (each.in_flight > 0 or now - each.seen < NEIGHBOUR_SECONDS)
        for other, each in _occupancy.items()
    )


def _slots_of(workspace_id: int, slots: int, quiet: bool, now: float) -> int:
    """(Under the lock.) How many of the workspace's requests may run at once in this process now:
    its share (`slots`), or OZ0_WEB_BUSY_SLOTS while it is busy and another workspace uses the
    process too."""
    busy_slots = int(settings.OZ0_WEB_BUSY_SLOTS)
    if quiet or not 0 < busy_slots < slots or not _has_neighbour(workspace_id, now):
        return slots
    return busy_slots


def _another_quiet(workspace_id: int) -> bool:
    """(Under the lock.) Whether another workspace's quiet request, or quiet push, is in flight."""
    if any(count > 0 for other, count in _quiet.items() if other != workspace_id):
        return True
    return bool(_quiet_pushes) and _next_push_end(workspace_id, time.monotonic()) is not None


def _wait_for_quiet(workspace_id: int, timeout: float, condition: threading.Condition) -> None:
    """(Under the lock.) Wait on `condition` at most `timeout`, and no later than the end of another
    workspace's quiet push (which ends by its time, with no notice)."""
    push_end = _next_push_end(workspace_id, time.monotonic()) if _quiet_pushes else None
    if push_end is not None:
        timeout = min(timeout, push_end - time.monotonic())
    condition.wait(timeout=max(0.0, timeout))


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
        quiet_lately = _is_quiet(workspace_id, started)
        quiet = quiet_first > 0 and quiet_lately  # goes first
        if share.running == 0 and share.waiting == 0:
            _admit(request, workspace_id, share, quiet=quiet)
            return
        if share.running < _slots_of(workspace_id, slots, quiet_lately, started) and (
            quiet or quiet_first <= 0 or not _another_quiet(workspace_id)
        ):
            _admit(request, workspace_id, share, quiet=quiet)
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
                # A request that waits is busy (its own share is full, or it was held back).
                free = share.running < _slots_of(workspace_id, slots, False, now)
                if first and free and (now >= quiet_until or not _another_quiet(workspace_id)):
                    admitted = True
                    break
                if now >= started + waited:
                    admitted = False
                    break
                # Woken by its own workspace's slot coming free, the request ahead of it leaving the
                # queue or another's quiet request ending; else at the end of the quiet-first wait,
                # or of the whole wait.
                wake_at = started + waited if not first or not free or now >= quiet_until else quiet_until
                if first and not free and share.running < slots:
                    # Held to the busy share by a neighbour, which leaves with no notice.
                    wake_at = min(wake_at, now + BUSY_RECHECK_SECONDS)
                _wait_for_quiet(workspace_id, wake_at - now, share.turn)
        finally:
            share.waiting -= 1
            share.queue.remove(ticket)
            share.turn.notify_all()  # the next in line looks again
        if not admitted:
            _forget_if_idle(workspace_id, share)
            raise WorkspaceBusy(waited)
        # A request that waited is not quiet: its own share was full, or another's quiet request
        # held it back because it was not.
        _admit(request, workspace_id, share, quiet=False)


def _admit(request: HttpRequest, workspace_id: int, share: _Share, *, quiet: bool) -> None:
    share.running += 1
    _in_flight(workspace_id, 1, time.monotonic())
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
                _quiet_ended.notify_all()
                # Other workspaces' requests held back for this one may go (their own order kept).
                for other_id, other in _shares.items():
                    if other_id != workspace_id and other.waiting and other.running < slots:
                        other.turn.notify_all()
        share = _shares.get(workspace_id)
        if share is None:
            return
        _in_flight(workspace_id, -1, time.monotonic())
        share.running -= 1
        share.turn.notify_all()
        _forget_if_idle(workspace_id, share)


# How long a quiet workspace's push, as it is handed to its sockets, counts as a quiet request: the
# event loop's part of a push (its sockets' membership stamp, the frames) takes a few turns of the
# loop, and each turn needs the interpreter the busy workspaces' requests hold.
QUIET_PUSH_SECONDS = 0.02
# Per workspace: until when (time.monotonic) its push being handed on counts as quiet. A mark ends
# by its time alone, so none outlives an event loop that stopped.
_quiet_pushes: dict[int, float] = {}


def push_is_quiet(workspace_id: int) -> None:
    """(The event loop's thread, handing a workspace's push to its sockets.) A push of a workspace
    with no request in flight in this process goes first as its quiet requests do: for
    QUIET_PUSH_SECONDS, busy workspaces' requests pause before their next query."""
    if float(settings.OZ0_WEB_QUIET_FIRST_SECONDS) <= 0:
        return
    with _lock:
        now = time.monotonic()
        if _is_quiet(workspace_id, now):
            _quiet_pushes[workspace_id] = now + QUIET_PUSH_SECONDS


def _next_push_end(workspace_id: int, now: float) -> float | None:
    """(Under the lock.) When the next of other workspaces' quiet pushes ends; expired marks go."""
    for other, until in list(_quiet_pushes.items()):
        if until <= now:
            del _quiet_pushes[other]
    ends = [until for other, until in _quiet_pushes.items() if other != workspace_id]
    return min(ends) if ends else None


def pause_for_quiet(request: HttpRequest) -> None:
    """While another workspace's quiet request runs, a request holding its share that is not quiet
    itself waits for it to end, within what is left of its own allowance."""
    held = getattr(request, SHARE_ATTRIBUTE, None)
    if held is None or held[1]:
        return
    workspace_id = held[0]
    if not _quiet and not _quiet_pushes:  # the common case: nothing quiet anywhere (read without the lock)
        return
    left = getattr(request, PAUSE_ATTRIBUTE, None)
    if left is None:
        left = max(0.0, float(settings.OZ0_WEB_QUIET_FIRST_SECONDS))
    if left <= 0:
        return
    started, paused = time.monotonic(), False
    with _lock:
        while _another_quiet(workspace_id):
            remaining = left - (time.monotonic() - started)
            if remaining <= 0:
                break
            paused = True
            _wait_for_quiet(workspace_id, remaining, _quiet_ended)
    if paused:
        setattr(request, PAUSE_ATTRIBUTE, max(0.0, left - (time.monotonic() - started)))


def _forget_if_idle(workspace_id: int, share: _Share) -> None:
    if share.running <= 0 and share.waiting <= 0:
        _shares.pop(workspace_id, None)


class WebShareMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        def between_queries(execute: Callable[..., object], sql: object, params: object, many: bool, context: object) -> object:
            pause_for_quiet(request)
            return execute(sql, params, many, context)

        try:
            # Outermost of the query wrappers: a pause is no part of a query's charged time.
            with connection.execute_wrapper(between_queries):
                return self.get_response(request)
        finally:
            give_back(request)
