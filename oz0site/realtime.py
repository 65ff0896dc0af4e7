"""Channel broadcasts, sent only after the transaction that caused them commits.

A Celery worker or a view publishes from sync code; the sends go through one
background event loop per process so channels_redis keeps its connections
instead of opening one per message.
"""

from __future__ import annotations

import asyncio
import logging
import threading
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


def publish(groups: list[str], event: dict[str, Any]) -> Future[None] | None:
    layer = get_channel_layer()
    if layer is None:
        return None

    async def send() -> None:
        for group in groups:
            await layer.group_send(group, event)

    future = asyncio.run_coroutine_threadsafe(send(), _background_loop())
    future.add_done_callback(_log_failure)
    return future


def _log_failure(future: Future[None]) -> None:
    error = future.exception()
    if error is not None:
        log.warning("realtime publish failed: %s", error)


def publish_on_commit(groups: list[str], event: dict[str, Any]) -> None:
    transaction.on_commit(lambda: publish(groups, event))
