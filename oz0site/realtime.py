"""Channel broadcasts, sent only after the transaction that caused them commits.

A Celery worker or a view publishes from sync code; the sends go through one
background event loop per process so channels_redis keeps its connections
instead of opening one per message.

A run's changes are coalesced per process: the first change of a run is pushed at once, and
the changes that follow within `COALESCE_SECONDS` of a push are folded into one push at the end
of that window (the latest status and seq, the tasks of all of them). Every receiver re-reads
what it shows on a push, so the last push of a window tells it everything; a run that changes
hundreds of times a second (a fan of quick calls) then costs at most one push per window, and
the other runs' pushes do not queue behind it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from concurrent.futures import Future
from typing import Any

from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)

_loop: asyncio.AbstractEventLoop | None = None
_loop_pid: int | None = None
_lock = threading.Lock()


def run_group(run_id: object) -> str:
    return f"run.{run_id}"


def workspace_group(workspace_id: object) -> str:
    return f"ws.{workspace_id}"


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop, _loop_pid
    import os

    with _lock:
        if _loop is None or _loop_pid != os.getpid() or not _loop.is_running():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="oz0-realtime", daemon=True)
            thread.start()
            _loop, _loop_pid = loop, os.getpid()
        return _loop


COALESCE_SECONDS = 0.05
# Per groups (one run's): when its last push went out, and the folded change waiting for the
# end of its window. Touched only on the background loop's thread.
_last_push: dict[tuple[str, ...], float] = {}
_waiting: dict[tuple[str, ...], dict[str, Any]] = {}
FORGET_AFTER = 4096


def fold(earlier: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """Two changes of one run as one push: the later state, the tasks of both (at most 50)."""
    if int(later.get("seq") or 0) < int(earlier.get("seq") or 0):
        earlier, later = later, earlier
    tasks = list(dict.fromkeys([*(earlier.get("tasks") or []), *(later.get("tasks") or [])]))[:50]
    return {**later, "tasks": tasks} if "tasks" in later or "tasks" in earlier else later


async def _push(layer: Any, groups: tuple[str, ...], event: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    if event.get("type") == "run.changed" and COALESCE_SECONDS > 0:
        if groups in _waiting:
            _waiting[groups] = fold(_waiting[groups], event)
            return
        delay = _last_push.get(groups, float("-inf")) + COALESCE_SECONDS - loop.time()
        if delay > 0:
            _waiting[groups] = event
            await asyncio.sleep(delay)
            event = _waiting.pop(groups)
        if len(_last_push) > FORGET_AFTER:
            horizon = loop.time() - COALESCE_SECONDS
            for key in [k for k, at in _last_push.items() if at < horizon]:
                del _last_push[key]
        _last_push[groups] = loop.time()
    # One wave: every socket the push reaches shares one membership-stamp read per user.
    event = {**event, "wave": uuid.uuid4().hex}
    # Together, so the layer publishes the run's and the workspace's message in one round trip.
    await asyncio.gather(*(layer.group_send(group, event) for group in groups))


def publish(groups: list[str], event: dict[str, Any]) -> Future[None] | None:
    layer = get_channel_layer()
    if layer is None:
        return None
    future = asyncio.run_coroutine_threadsafe(_push(layer, tuple(groups), event), _background_loop())
    future.add_done_callback(_log_failure)
    return future


def _log_failure(future: Future[None]) -> None:
    error = future.exception()
    if error is not None:
        log.warning("realtime publish failed: %s", error)


def publish_on_commit(groups: list[str], event: dict[str, Any]) -> None:
    # robust: a push that cannot leave (Redis away) is logged, never the committed change's error.
    transaction.on_commit(lambda: publish(groups, event), robust=True)
