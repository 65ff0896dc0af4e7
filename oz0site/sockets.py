"""What every live socket is held to, whoever it belongs to: the same origin, a cap, a session.

* **Same origin.** A browser page may open a socket only to the origin it was served from: the
  Origin header's scheme, host *and port* must be the request's own (`Host`), or one of
  CSRF_TRUSTED_ORIGINS exactly, and its host one of ALLOWED_HOSTS. Channels' own validator
  matched the host alone, so a page on another port of the same host passed.
* **A cap.** One person holds at most OZ0_SOCKETS_PER_USER sockets and one signed-in session at
  most OZ0_SOCKETS_PER_SESSION, across every web process: each socket holds a lease in two Redis
  sorted sets (member: its channel name, score: the lease's end), taken atomically by one script,
  renewed while the socket lives and dropped when it closes. A web process that dies leaves
  leases that end by themselves (LEASE_SECONDS). A socket over the cap is accepted and closed at
  once with CLOSE_TOO_MANY, so the client reads a code, not a failed handshake.
* **A session.** Every socket joins its session's group; signing out (`user_logged_out`) sends
  `session.ended` there, and the socket closes with CLOSE_SIGNED_OUT.
* **No one thread.** A socket's database work (its session's user, its membership) runs in the
  event loop's pool of threads (`database_call`), never on the process's one thread for
  thread-sensitive calls, where Channels runs its own: there a neighbour's storm of connects
  queued every other workspace's connect behind it. `session_auth` replaces Channels'
  AuthMiddlewareStack for that.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar
from urllib.parse import urlsplit

from channels.auth import AuthMiddleware, get_user
from channels.db import database_sync_to_async
from channels.security.websocket import WebsocketDenier
from channels.sessions import CookieMiddleware, SessionMiddleware
from django.conf import settings
from django.db import connection
from django.http.request import split_domain_port, validate_host

from tenancy.membership import async_client

CLOSE_SIGNED_OUT = 4401
CLOSE_TOO_MANY = 4429
LEASE_SECONDS = 120.0
RENEW_SECONDS = LEASE_SECONDS / 3

DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}

P = ParamSpec("P")
R = TypeVar("R")


def database_call(func: Callable[P, R]) -> Callable[P, Coroutine[Any, Any, R]]:
    """`func` made awaitable for a socket: run in the event loop's pool of threads, the stale
    connection closed around it (a pooled connection goes back to the pool), as Channels'
    `database_sync_to_async` does but off the process's one thread for thread-sensitive calls.
    Each call stands alone (no transaction spans two), so no thread needs to be the same one."""
    return database_sync_to_async(func, thread_sensitive=False)


# Channels' get_user (the session read, then its user), as it is but off the one thread.
_user_of_session = database_call(get_user.func)


class SessionUserMiddleware(AuthMiddleware):
    """Channels' AuthMiddleware, its user read through `database_call`."""

    async def resolve_scope(self, scope: dict[str, Any]) -> None:
        scope["user"]._wrapped = await _user_of_session(scope)


def session_auth(inner: Any) -> Any:
    """Cookies, the session, its user: Channels' AuthMiddlewareStack, but for the thread."""
    return CookieMiddleware(SessionMiddleware(SessionUserMiddleware(inner)))


# KEYS: the user's set, the session's set. ARGV: channel, now, lease end, user cap, session cap.
# Returns 0 (taken), 1 (the user is at the cap) or 2 (the session is).
_ACQUIRE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[2])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 1 end
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[5]) then return 2 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3]) - tonumber(ARGV[2])) + 1)
redis.call('EXPIRE', KEYS[2], math.ceil(tonumber(ARGV[3]) - tonumber(ARGV[2])) + 1)
return 0
"""


def session_tag(session_key: str) -> str:
    """A session's name in Redis keys and group names: its key hashed (the key is a credential)."""
    return hashlib.sha256(session_key.encode()).hexdigest()[:32]


def session_group(session_key: str) -> str:
    return f"session.{session_tag(session_key)}"


def session_signed_out(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    """`user_logged_out`: the session's sockets close (the session is flushed right after)."""
    from oz0site.realtime import publish_on_commit

    session_key = getattr(getattr(request, "session", None), "session_key", None)
    if session_key:
        publish_on_commit([session_group(session_key)], {"type": "session.ended"})


def _keys(user_id: Any, session_key: str) -> list[str]:
    base = f"oz0:sockets:{connection.settings_dict['NAME']}"
    return [f"{base}:user:{user_id}", f"{base}:session:{session_tag(session_key)}"]


async def take_lease(channel: str, user_id: Any, session_key: str) -> int:
    """0 when the socket may stay; 1 or 2 when its person or its session holds as many as allowed."""
    now = time.time()
    result = await async_client().eval(  # type: ignore[no-untyped-call]
        _ACQUIRE,
        2,
        *_keys(user_id, session_key),
        channel,
        now,
        now + LEASE_SECONDS,
        max(1, settings.OZ0_SOCKETS_PER_USER),
        max(1, settings.OZ0_SOCKETS_PER_SESSION),
    )
    return int(result)


async def renew_lease(channel: str, user_id: Any, session_key: str) -> None:
    end = time.time() + LEASE_SECONDS
    pipe = async_client().pipeline(transaction=False)
    for key in _keys(user_id, session_key):
        pipe.zadd(key, {channel: end}, xx=True)
        pipe.expire(key, int(LEASE_SECONDS) + 1)
    await pipe.execute()


async def drop_lease(channel: str, user_id: Any, session_key: str) -> None:
    pipe = async_client().pipeline(transaction=False)
    for key in _keys(user_id, session_key):
        pipe.zrem(key, channel)
    await pipe.execute()


def _origin(value: str, default_scheme: str) -> tuple[str, str, int] | None:
    try:
        parts = urlsplit(value if "//" in value else f"{default_scheme}://{value}")
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    scheme = parts.scheme.lower().replace("wss", "https").replace("ws", "http")
    return scheme, parts.hostname.lower(), port or DEFAULT_PORTS.get(scheme, 0)


def same_origin(origin: str, host: str) -> bool:
    """Is `origin` (the Origin header) this server's own, `host` being the request's Host header?

    One of CSRF_TRUSTED_ORIGINS, exactly; or the request's own scheme-host-port (a port left out
    is its scheme's default) on a host ALLOWED_HOSTS lets in.
    """
    theirs = _origin(origin, "http")
    if theirs is None or "//" not in origin:
        return False
    if any(_origin(trusted, "https") == theirs for trusted in settings.CSRF_TRUSTED_ORIGINS):
        return True
    scheme, name, _ = theirs
    domain, _ = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS) or not validate_host(name, settings.ALLOWED_HOSTS):
        return False
    return _origin(f"{scheme}://{host}", scheme) == theirs


class SameOriginValidator:
    """In place of Channels' AllowedHostsOriginValidator: `same_origin` (scheme, host and port)."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        headers = dict(scope.get("headers") or [])
        origin = headers.get(b"origin", b"").decode("latin1")
        host = headers.get(b"host", b"").decode("latin1")
        if origin and host and same_origin(origin, host):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)
