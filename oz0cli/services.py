"""DATABASE_URL and REDIS_URL for a command's life: the ones given, or embedded ones it starts.

Whatever is started is stopped when the command exits (unless another `./oz0` still uses it);
a bad or unreachable URL is one line naming the variable (exit 2), never a traceback.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from oz0cli import ROOT, Fatal, say
from oz0cli.embedded import EmbeddedPostgres, EmbeddedRedis
from oz0site.config import ConfigurationError, check_reachable, checked_database_url, checked_redis_url

SLOW_STOP_SECONDS = 2.0


def data_dir() -> Path:
    path = Path(os.environ.get("OZ0_DATA_DIR") or ROOT / ".oz0").resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def services_to_embed(environ: Mapping[str, str]) -> list[str]:
    """The variables an embedded service fills: those unset or empty, PostgreSQL first."""
    return [name for name in ("DATABASE_URL", "REDIS_URL") if not environ.get(name)]


@contextmanager
def services() -> Iterator[list[EmbeddedPostgres | EmbeddedRedis]]:
    """Use DATABASE_URL / REDIS_URL when set; otherwise start embedded ones for this process's
    life. Yields the embedded services this process owns (`./oz0 up` watches them)."""
    started: list[EmbeddedPostgres | EmbeddedRedis] = []
    try:
        for name in services_to_embed(os.environ):
            service = EmbeddedPostgres(data_dir()) if name == "DATABASE_URL" else EmbeddedRedis(data_dir())
            started.append(service)
            os.environ[name] = service.start()
        check_configuration()
        yield [service for service in started if service.owned]
    finally:
        for service in reversed(started):
            began = time.monotonic()
            service.stop()
            took = time.monotonic() - began
            if took >= SLOW_STOP_SECONDS:  # said, so a slow stop can be told from a hung one
                say(f"the embedded {service.name} took {took:.1f}s to stop")


def check_configuration() -> None:
    """Bad or unreachable URLs become one line naming the variable (exit 2), never a traceback."""
    try:
        database_url = checked_database_url(os.environ.get("DATABASE_URL", ""))
        redis_url = checked_redis_url(os.environ.get("REDIS_URL", ""))
        check_reachable(database_url=database_url, redis_url=redis_url)
    except ConfigurationError as error:
        raise Fatal(str(error)) from None
