"""A stamp per user that changes whenever their memberships (or the account itself) change.

Live sockets re-check membership before every push: comparing the stamp costs one Redis read,
and only a changed stamp costs a database read. Signals bump it on every save and delete of a
membership or a user (`TenancyConfig.ready`).

The stamp is a plain Redis key, read by the consumers with redis' asyncio client on the event
loop itself: Django's cache answers `aget` through the one thread that every consumer's sync
calls share, so a wave of pushes queued behind it one by one, each waiting for the GIL while
the web process served requests (a push's p95 grew with the load, not with the pushes).

The client's pool is a blocking one of OZ0_SOCKET_REDIS_CONNECTIONS per event loop: a burst of
reads larger than the pool waits its turn (up to OZ0_SOCKET_REDIS_WAIT seconds) instead of raising
`MaxConnectionsError`, which used to close every socket that pushed during the burst with 1011.
A push wave (one publish, one `wave` id) reads each user's stamp once, however many of their
sockets it reaches: the sockets share the read in flight (`stamp_in_wave`).
"""

from __future__ import annotations

import asyncio
import uuid
import weakref
from collections import OrderedDict
from functools import lru_cache
from typing import Any

import redis
import redis.asyncio as aioredis
from django.conf import settings
from django.db import connection, transaction

# One asyncio client per event loop (a client's connections belong to the loop that opened them).
_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aioredis.Redis] = weakref.WeakKeyDictionary()
# Per event loop, the stamp reads of the latest waves: (user, wave) -> the read, shared.
_wave_reads: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, OrderedDict[tuple[Any, str], asyncio.Future[str | None]]] = (
    weakref.WeakKeyDictionary()
)
WAVE_READS_KEPT = 4096


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
        pool: aioredis.BlockingConnectionPool = aioredis.BlockingConnectionPool.from_url(
            settings.REDIS_URL,
            max_connections=settings.OZ0_SOCKET_REDIS_CONNECTIONS,
            timeout=settings.OZ0_SOCKET_REDIS_WAIT,
        )
        client = _async_clients[loop] = aioredis.Redis(connection_pool=pool)
    return client


def async_client() -> aioredis.Redis:
    """The event loop's Redis client (its blocking pool) for the sockets' other keys."""
    return _async_client()


async def current_stamp_async(user_id: Any) -> str | None:
    """The stamp, read on the running event loop without a thread."""
    value = await _async_client().get(stamp_key(user_id))
    return value.decode() if isinstance(value, bytes) else None


async def stamp_in_wave(user_id: Any, wave: str | None) -> str | None:
    """The stamp as one push wave sees it: the first socket of the user reads, the others share it."""
    if not wave:
        return await current_stamp_async(user_id)
    loop = asyncio.get_running_loop()
    reads = _wave_reads.get(loop)
    if reads is None:
        reads = _wave_reads[loop] = OrderedDict()
    read = reads.get((user_id, wave))
    if read is None:
        read = reads[(user_id, wave)] = loop.create_task(current_stamp_async(user_id))
        while len(reads) > WAVE_READS_KEPT:
            reads.popitem(last=False)
    # shield: one socket closing mid-read does not cancel the read the others wait on.
    return await asyncio.shield(read)


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
