"""Checks of the connection URLs, so a bad value is one clear line, not a traceback, and what the
settings add to a connection."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import SplitResult, urlsplit

from django.core.exceptions import ImproperlyConfigured


class ConfigurationError(ImproperlyConfigured):
    """A setting from the environment is missing or malformed; the message names it."""


def checked_database_url(value: str) -> str:
    if not value:
        raise ConfigurationError(
            "DATABASE_URL is not set: give a postgres://user@host:port/name URL, or use ./oz0, "
            "which starts an embedded PostgreSQL when it is unset"
        )
    parts = _split("DATABASE_URL", value)
    if parts.scheme not in {"postgres", "postgresql", "pgsql"}:
        raise ConfigurationError(f"DATABASE_URL must start with postgres://, not {parts.scheme or 'nothing'}://")
    if not parts.path.strip("/") and not parts.query:
        raise ConfigurationError("DATABASE_URL names no database: add /NAME after the host")
    return value


def idle_in_transaction_milliseconds(seconds: float) -> int:
    """PostgreSQL's idle_in_transaction_session_timeout for a bound in seconds (0 would mean none)."""
    return max(1, round(seconds * 1000))


@contextmanager
def migrating(connection: Any) -> Iterator[None]:
    """A migration's session, without the idle-in-transaction bound: between the statements of a
    migration's transaction runs its own Python (the models' states built, a data migration's
    loop), on a loaded machine for longer than any lease, and the server would end it half-way.
    The connection's own bound comes back after (a test run migrates, then goes on with it).
    Migrations connect to PostgreSQL itself, never through PgBouncer, so the setting goes no
    further than this session."""
    with connection.cursor() as cursor:
        cursor.execute("SET idle_in_transaction_session_timeout = 0")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET idle_in_transaction_session_timeout")


def idle_in_transaction_option(seconds: float, given: str = "") -> str:
    """libpq's `options` startup parameter with PostgreSQL's idle-in-transaction timeout added to
    what DATABASE_URL's own `?options=` gave."""
    setting = f"-c idle_in_transaction_session_timeout={idle_in_transaction_milliseconds(seconds)}"
    return f"{given} {setting}" if given else setting


def dead_peer_options(seconds: float) -> dict[str, int]:
    """libpq's connection parameters that give up on a database host which has answered nothing for
    about `seconds` (a cut network, a host gone without a word): TCP keepalives on an idle
    connection, and a bound on data sent and not acknowledged. Without them a process waits for a
    silent peer until TCP gives up, which takes many minutes. A slow query is not silence: the
    server's kernel acknowledges both. 0: none (TCP's own defaults)."""
    if seconds <= 0:
        return {}
    return {
        "keepalives": 1,
        "keepalives_idle": max(1, round(seconds / 2)),
        "keepalives_interval": max(1, round(seconds / 6)),
        "keepalives_count": 3,
        "tcp_user_timeout": round(seconds * 1000),
    }


def checked_redis_url(value: str) -> str:
    if not value:
        raise ConfigurationError(
            "REDIS_URL is not set: give a redis://host:port/db URL, or use ./oz0, which starts an embedded Redis when it is unset"
        )
    parts = _split("REDIS_URL", value)
    if parts.scheme not in {"redis", "rediss", "unix"}:
        raise ConfigurationError(f"REDIS_URL must start with redis://, rediss:// or unix://, not {parts.scheme or 'nothing'}://")
    if parts.scheme != "unix" and not parts.hostname:
        raise ConfigurationError("REDIS_URL names no host")
    return value


def _split(name: str, value: str) -> SplitResult:
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - urlsplit checks the port only when it is read
    except ValueError as error:
        raise ConfigurationError(f"{name} is malformed: {error}") from None
    return parts


def check_reachable(*, database_url: str, redis_url: str, timeout: float = 3.0) -> None:
    """Connect to PostgreSQL and Redis once; an unreachable one is a ConfigurationError naming its variable."""
    check_database_reachable(database_url, timeout=timeout)
    check_redis_reachable(redis_url, timeout=timeout)


def check_database_reachable(url: str, *, timeout: float = 3.0) -> None:
    import environ
    import psycopg

    config = environ.Env.db_url_config(url)
    options = dict(config.get("OPTIONS") or {})
    params: dict[str, Any] = {
        "host": config.get("HOST") or options.pop("host", None) or None,
        "port": config.get("PORT") or options.pop("port", None) or None,
        "user": config.get("USER") or None,
        "password": config.get("PASSWORD") or None,
        "dbname": config.get("NAME") or None,
        "connect_timeout": max(1, int(timeout)),
    }
    params.update({k: v for k, v in options.items() if k in {"sslmode", "user", "password", "options"}})
    where = _where(params.get("host"), params.get("port"), default_port=5432)
    try:
        with psycopg.connect(**{k: v for k, v in params.items() if v is not None}) as connection:
            connection.execute("SELECT 1")
    except psycopg.Error as error:
        raise ConfigurationError(f"DATABASE_URL: cannot connect to {where} ({_reason(str(error))})") from None


def check_redis_reachable(url: str, *, timeout: float = 3.0) -> None:
    import redis

    parts = urlsplit(url)
    where = parts.path if parts.scheme == "unix" else _where(parts.hostname, parts.port, default_port=6379)
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        client.ping()
    except redis.RedisError as error:
        raise ConfigurationError(f"REDIS_URL: cannot connect to {where} ({_reason(str(error))})") from None
    finally:
        client.close()


def describe_connection_error(error: BaseException) -> str | None:
    """The one line for a failed connection of a running command, or None when it is something else."""
    from django.conf import settings

    try:
        check_reachable(database_url=settings.DATABASE_URL, redis_url=settings.REDIS_URL)
    except ConfigurationError as problem:
        return str(problem)
    except Exception:
        return None
    return None


_REASONS = (
    ("connection refused", "connection refused"),
    ("timeout expired", "timed out"),
    ("timed out", "timed out"),
    ("name or service not known", "unknown host"),
    ("nodename nor servname", "unknown host"),
    ("temporary failure in name resolution", "unknown host"),
    ("no such file or directory", "no server socket there"),
    ("password authentication failed", "password authentication failed"),
    ("authentication required", "authentication required"),
    ("invalid username-password", "wrong password"),
)


def _reason(text: str) -> str:
    lowered = text.lower()
    for needle, reason in _REASONS:
        if needle in lowered:
            return reason
    if "does not exist" in lowered:
        for line in text.splitlines():
            if "does not exist" in line:
                return line.split("FATAL:")[-1].strip()
    first = text.strip().splitlines()[0] if text.strip() else "no reason given"
    return first[:200]


def _where(host: Any, port: Any, *, default_port: int) -> str:
    if host and str(host).startswith("/"):
        return str(host)
    return f"{host or 'localhost'}:{port or default_port}"
