"""Checks of the connection URLs, so a bad value is one clear line, not a traceback."""

from __future__ import annotations

from urllib.parse import urlsplit

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


def checked_redis_url(value: str) -> str:
    if not value:
        raise ConfigurationError(
            "REDIS_URL is not set: give a redis://host:port/db URL, or use ./oz0, "
            "which starts an embedded Redis when it is unset"
        )
    parts = _split("REDIS_URL", value)
    if parts.scheme not in {"redis", "rediss", "unix"}:
        raise ConfigurationError(f"REDIS_URL must start with redis://, rediss:// or unix://, not {parts.scheme or 'nothing'}://")
    if parts.scheme != "unix" and not parts.hostname:
        raise ConfigurationError("REDIS_URL names no host")
    return value


def _split(name: str, value: str):  # type: ignore[no-untyped-def]
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - urlsplit checks the port only when it is read
    except ValueError as error:
        raise ConfigurationError(f"{name} is malformed: {error}") from None
    return parts
