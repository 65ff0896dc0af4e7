"""A stamp per user that changes whenever their memberships (or the account itself) change.

Live sockets re-check membership before every push: comparing the stamp costs one Redis read,
and only a changed stamp costs a database read. Signals bump it on every save and delete of a
membership or a user (`RunsConfig.ready`).

The stamp is a plain Redis key, read by the consumers with redis' asyncio client on the event
loop itself: Django's cache answers `aget` through the one thread that every consumer's sync
calls share, so a wave of pushes queued behind it one by one, each waiting for the GIL while
the web process served requests (a push's p95 grew with the load, not with the pushes).
"""

from __future__ import annotations

import asyncio
import uuid
import weakref
from functools import lru_cache
from typing import Any

import redis
import redis.asyncio as aioredis
from django.conf import settings
from django.db import connection, transaction

# One asyncio client per event loop (a client's connections belong to the loop that opened them).
_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aioredis.Redis] = weakref.WeakKeyDictionary()


def stamp_key(user_id: Any) -> str:
    # Users are rows of one database: installs (and test sessions) sharing a Redis keep apart.
    return f"oz0:membership:{connection.settings_dict['NAME']}:{user_id}"


@lru_cache(maxsize=1)
def _client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


def _async_client() -> aioredis.Redis:
    loop = asyncio.get_running_loop()
    client = _async_clients.get(loop)
    if client is None:
        client = _async_clients[loop] = aioredis.Redis.from_url(settings.REDIS_URL)
    return client


async def current_stamp_async(user_id: Any) -> str | None:
    """The stamp, read on the running event loop without a thread."""
    value = await _async_client().get(stamp_key(user_id))
    return value.decode() if isinstance(value, bytes) else None


def bump(user_id: Any) -> None:
    """Move the stamp once the change commits: moved before, a socket checking in between would
    read the membership as it still stood, keep the new stamp and never ask again."""
    key = stamp_key(user_id)
    # robust: with Redis away the change still commits and answers; Redis restarted has lost every
    # stamp, which every socket reads as moved, so none misses this change.
    transaction.on_commit(lambda: _client().set(key, uuid.uuid4().hex), robust=True)


def membership_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    bump(instance.user_id)


def user_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    bump(instance.pk)
