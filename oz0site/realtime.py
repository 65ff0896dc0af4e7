"""Channel broadcasts, sent only after the transaction that caused them commits.

A Celery worker or a view publishes from sync code; the sends go through one
background event loop per process so channels_redis keeps its connections
instead of opening one per message.

Changes are coalesced per group and process: the first change is pushed at once, and the
changes that follow within the group's window of a push are folded into one push at the end of
that window. Every receiver re-reads what it shows on a push, so the last push of a window tells
it everything. A run's group folds its own changes (the latest status and seq, the tasks of all
of them) within `COALESCE_SECONDS`: a run that changes hundreds of times a second (a fan of
quick calls) costs at most one push per window, and other runs' pushes do not queue behind it.
A workspace's group folds the changes of all its runs within `WORKSPACE_COALESCE_SECONDS` (the
latest change, and the ids of the runs that changed): a workspace whose runs change thousands
of times a second costs each of its sockets a few pushes a second, so the web process that
forwards them keeps its time for other workspaces' pushes and requests.

A group that stays busy gets a longer window: each push that had to fold changes doubles its
window, up to `BUSY_WINDOW_SECONDS` (runs) or `BUSY_WORKSPACE_WINDOW_SECONDS` (workspaces), and
a change that finds its window passed resets it. A workspace whose runs change without pause
then costs each of its sockets one push a second, not ten (what a web process forwarding 200 of
its sockets spent on them took a quiet workspace's pushes from 10 ms to 300 ms), while a group
that changes now and then, however often it pushed before, is pushed at once.
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
WORKSPACE_COALESCE_SECONDS = 0.1
BUSY_WINDOW_SECONDS = 0.5
BUSY_WORKSPACE_WINDOW_SECONDS = 1.0
# Per group: when its last push went out, the folded change waiting for the end of its window,
# and the window it has grown to while busy. Touched only on the background loop's thread.
_last_push: dict[str, float] = {}
_waiting: dict[str, dict[str, Any]] = {}
_grown: dict[str, float] = {}
FORGET_AFTER = 4096
RUNS_NAMED_AT_MOST = 50


def fold(earlier: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """Two changes of one run as one push: the later state, the tasks of both (at most 50)."""
    if int(later.get("seq") or 0) < int(earlier.get("seq") or 0):
        earlier, later = later, earlier
    tasks = list(dict.fromkeys([*(earlier.get("tasks") or []), *(later.get("tasks") or [])]))[:50]
    return {**later, "tasks": tasks} if "tasks" in later or "tasks" in earlier else later


def fold_runs(earlier: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """Two changes in one workspace as one push: one run's fold, or the change that came later
    naming every run that changed (at most 50; tasks of different runs are not mixed)."""
    runs = list(dict.fromkeys([*_runs_of(earlier), *_runs_of(later)]))[:RUNS_NAMED_AT_MOST]
    if runs == [later.get("run")]:
        return fold(earlier, later)
    folded = {key: value for key, value in later.items() if key != "tasks"}
    return {**folded, "runs": runs}


def _runs_of(change: dict[str, Any]) -> list[Any]:
    return list(change.get("runs") or ([change["run"]] if change.get("run") else []))


def _base_window(group: str) -> float:
    return WORKSPACE_COALESCE_SECONDS if group.startswith("ws.") else COALESCE_SECONDS


def _busy_window(group: str) -> float:
    return BUSY_WORKSPACE_WINDOW_SECONDS if group.startswith("ws.") else BUSY_WINDOW_SECONDS


def _window_of(group: str) -> float:
    return _grown.get(group) or _base_window(group)


async def _push(layer: Any, group: str, event: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    window = _window_of(group)
    if event.get("type") == "run.changed" and window > 0:
        folding = fold_runs if group.startswith("ws.") else fold
        if group in _waiting:
            _waiting[group] = folding(_waiting[group], event)
            return
        delay = _last_push.get(group, float("-inf")) + window - loop.time()
        if delay > 0:
            _waiting[group] = event
            await asyncio.sleep(delay)
            event = _waiting.pop(group)
            # Busy: the next push of this group waits longer, up to its busy window.
            _grown[group] = min(_busy_window(group), 2 * window)
        else:
            _grown.pop(group, None)
        if len(_last_push) > FORGET_AFTER:
            horizon = loop.time() - max(BUSY_WINDOW_SECONDS, BUSY_WORKSPACE_WINDOW_SECONDS)
            for key in [k for k, at in _last_push.items() if at < horizon]:
                del _last_push[key]
                _grown.pop(key, None)
        _last_push[group] = loop.time()
    # One wave: every socket the push reaches shares one membership-stamp read per user.
    await layer.group_send(group, {**event, "wave": uuid.uuid4().hex})


async def _push_all(layer: Any, groups: tuple[str, ...], event: dict[str, Any]) -> None:
    # Together: the layer publishes sends made while one is in flight in one round trip.
    await asyncio.gather(*(_push(layer, group, event) for group in groups))


def publish(groups: list[str], event: dict[str, Any]) -> Future[None] | None:
    layer = get_channel_layer()
    if layer is None:
        return None
    future = asyncio.run_coroutine_threadsafe(_push_all(layer, tuple(groups), event), _background_loop())
    future.add_done_callback(_log_failure)
    return future


def _log_failure(future: Future[None]) -> None:
    error = future.exception()
    if error is not None:
        log.warning("realtime publish failed: %s", error)


def publish_on_commit(groups: list[str], event: dict[str, Any]) -> None:
    # robust: a push that cannot leave (Redis away) is logged, never the committed change's error.
    transaction.on_commit(lambda: publish(groups, event), robust=True)
