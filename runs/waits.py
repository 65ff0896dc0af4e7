"""The wait endpoint's machinery (GetJobWait): a bounded number of waits per user, each holding
no database connection while it is idle.

A wait reads the run, then sleeps until the run's channel-layer group hears of a change (the
kernel publishes `run.changed` there after every committed change; one receiver per process
listens for all of its waits) and reads again only then, or every `RECHECK_SECONDS` in case a
publish was lost. Each read closes its database
connection, so a hundred viewers waiting hold no connection the workers need.

The per-user limit lives in the cache (Redis), so it holds across web processes: past
`OZ0_WAITS_PER_USER` open waits, the next one is refused with 429 `too_many_waits`, and
another user's waits are not affected.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.core.cache import cache
from django.db import connection

from oz0site.realtime import run_group
from runs.kernel import KernelError

log = logging.getLogger(__name__)

WAIT_MAX_SECONDS = 60.0
# A wait re-reads the run this often even when no message came (a publish may be lost).
RECHECK_SECONDS = 5.0
# Without a channel layer, a wait polls this often (still holding no connection between reads).
POLL_SECONDS = 1.0
# How long a user's count outlives its last wait, should a process die holding slots.
SLOT_TTL_SECONDS = int(WAIT_MAX_SECONDS) + 30
# A group join or leave slower than this means the layer is in trouble: the wait polls instead.
LAYER_OP_SECONDS = 2.0

T = TypeVar("T")


class TooManyWaits(KernelError):
    status = 429
    retry_after = 1

    def __init__(self, limit: int) -> None:
        super().__init__(
            "too_many_waits",
            f"you have {limit} waits open, the most one user may hold; let one finish (or wait with a shorter timeout)",
        )


def _release_connection() -> None:
    """Close this thread's database connection unless a transaction is open (a test's wrapper)."""
    if not connection.in_atomic_block:
        connection.close()


async def read(fn: Callable[..., T], *args: Any) -> T:
    """Run a database read in the request's thread, then give its connection back."""

    def read_and_release() -> T:
        try:
            return fn(*args)
        finally:
            _release_connection()

    return await sync_to_async(read_and_release)()


def _slot_key(user_id: Any) -> str:
    # Users are rows of one database; installs (and test sessions) sharing a Redis keep apart.
    return f"oz0:waits:{connection.settings_dict['NAME']}:{user_id}"


def _take_slot(user_id: Any, limit: int) -> None:
    key = _slot_key(user_id)
    cache.add(key, 0, timeout=SLOT_TTL_SECONDS)
    try:
        held = cache.incr(key)
    except ValueError:  # the key expired between add and incr
        cache.add(key, 0, timeout=SLOT_TTL_SECONDS)
        held = cache.incr(key)
    cache.touch(key, SLOT_TTL_SECONDS)
    if held > limit:
        _give_slot(user_id)
        raise TooManyWaits(limit)


def _give_slot(user_id: Any) -> None:
    try:
        if cache.decr(_slot_key(user_id)) < 0:
            cache.set(_slot_key(user_id), 0, timeout=SLOT_TTL_SECONDS)
    except ValueError:  # expired meanwhile: nothing left to give back
        pass


@asynccontextmanager
async def slot(user: Any) -> AsyncIterator[None]:
    """One of the user's `OZ0_WAITS_PER_USER` concurrent waits, or TooManyWaits."""
    limit = int(settings.OZ0_WAITS_PER_USER)
    await sync_to_async(_take_slot)(user.pk, limit)
    try:
        yield
    finally:
        await sync_to_async(_give_slot)(user.pk)


class RunChanges:
    """One receiver per event loop (per web process): a channel of the layer, subscribed to the
    groups of the runs someone waits on, that wakes those waits. Waits never receive from the
    layer themselves, so a wait that times out cancels nothing but its own sleep."""

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self.channel: str | None = None
        self.waiters: dict[str, set[asyncio.Event]] = {}
        self.receiver: asyncio.Task[None] | None = None
        self.lock = asyncio.Lock()

    async def subscribe(self, run_id: Any) -> asyncio.Event:
        return await asyncio.wait_for(self._subscribe(run_id), LAYER_OP_SECONDS)

    async def unsubscribe(self, run_id: Any, woken: asyncio.Event) -> None:
        await asyncio.wait_for(self._unsubscribe(run_id, woken), LAYER_OP_SECONDS)

    async def _subscribe(self, run_id: Any) -> asyncio.Event:
        key = str(run_id)
        woken = asyncio.Event()
        async with self.lock:
            if self.channel is None:
                self.channel = await self.layer.new_channel("oz0-waits.")
            if self.receiver is None or self.receiver.done():
                self.receiver = asyncio.ensure_future(self._receive())
            first = key not in self.waiters
            self.waiters.setdefault(key, set()).add(woken)
            if first:
                try:
                    await self.layer.group_add(run_group(key), self.channel)
                except BaseException:  # the wait will poll: leave no waiter behind for this run
                    self.waiters.pop(key, None)
                    raise
        return woken

    async def _unsubscribe(self, run_id: Any, woken: asyncio.Event) -> None:
        key = str(run_id)
        async with self.lock:
            events = self.waiters.get(key, set())
            events.discard(woken)
            if not events:
                self.waiters.pop(key, None)
                if self.channel is not None:
                    await self.layer.group_discard(run_group(key), self.channel)

    async def _receive(self) -> None:
        assert self.channel is not None
        while True:
            try:
                message = await self.layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # Redis hiccup: the waits' own re-reads cover the gap
                log.warning("wait: receiving run changes failed (%s)", error)
                await asyncio.sleep(POLL_SECONDS)
                continue
            for woken in self.waiters.get(str(message.get("run")), set()):
                woken.set()


_changes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, RunChanges] = weakref.WeakKeyDictionary()


def _run_changes() -> RunChanges | None:
    layer = get_channel_layer()
    if layer is None:
        return None
    loop = asyncio.get_running_loop()
    changes = _changes.get(loop)
    if changes is None or changes.layer is not layer:
        changes = _changes[loop] = RunChanges(layer)
    return changes


class Wakeup:
    """Sleeps until the run changes, or a timeout passes."""

    def __init__(self, woken: asyncio.Event | None) -> None:
        self.woken = woken

    async def sleep(self, seconds: float) -> None:
        if self.woken is None:
            await asyncio.sleep(min(seconds, POLL_SECONDS))
            return
        try:
            await asyncio.wait_for(self.woken.wait(), timeout=min(seconds, RECHECK_SECONDS))
        except TimeoutError:
            pass
        self.woken.clear()


@asynccontextmanager
async def wakeup(run_id: Any) -> AsyncIterator[Wakeup]:
    """Subscribe to the run's changes for the wait's life (before the read that decides to sleep,
    so a change committed in between is not missed)."""
    changes = _run_changes()
    woken = None
    if changes is not None:
        try:
            woken = await changes.subscribe(run_id)
        except Exception as error:  # the channel layer is down: fall back to polling
            log.warning("wait: cannot subscribe to run %s (%s); polling instead", run_id, error)
            woken = None
    try:
        yield Wakeup(woken)
    finally:
        if changes is not None and woken is not None:
            try:
                await changes.unsubscribe(run_id, woken)
            except Exception as error:
                log.warning("wait: cannot unsubscribe from run %s (%s)", run_id, error)


def clamp_timeout(timeout: float) -> float:
    return max(0.0, min(float(timeout), WAIT_MAX_SECONDS))
