"""Bad configuration is one clear line naming the variable, exit 2, never a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.conf import settings

from tests.foundation.helpers import clean_env, closed_port, manage, oz0


def assert_one_line(result: object, expected: str) -> None:
    stderr = result.stderr  # type: ignore[attr-defined]
    assert result.returncode == 2, stderr  # type: ignore[attr-defined]
    assert "Traceback" not in stderr + result.stdout  # type: ignore[attr-defined]
    assert stderr.strip().splitlines() == [expected]


@pytest.mark.parametrize(
    ("url", "line"),
    [
        ("mysql://root@127.0.0.1/oz0", "oz0: DATABASE_URL must start with postgres://, not mysql://"),
        (
            "postgres://postgres@127.0.0.1:port/oz0",
            "oz0: DATABASE_URL is malformed: Port could not be cast to integer value as 'port'",
        ),
        ("postgres://postgres@127.0.0.1:5432", "oz0: DATABASE_URL names no database: add /NAME after the host"),
    ],
)
def test_it_names_a_malformed_database_url(url: str, line: str) -> None:
    assert_one_line(manage("check", env=clean_env(DATABASE_URL=url, REDIS_URL=settings.REDIS_URL, DEBUG="1")), line)


def test_it_names_a_malformed_redis_url() -> None:
    env = clean_env(DATABASE_URL=os.environ["DATABASE_URL"], REDIS_URL="http://127.0.0.1:6379", DEBUG="1")
    assert_one_line(manage("check", env=env), "oz0: REDIS_URL must start with redis://, rediss:// or unix://, not http://")


def test_it_names_an_unreachable_database_in_manage_py() -> None:
    port = closed_port()
    env = clean_env(DATABASE_URL=f"postgres://postgres@127.0.0.1:{port}/oz0", REDIS_URL=settings.REDIS_URL, DEBUG="1")
    assert_one_line(
        manage("migrate", "--check", env=env), f"oz0: DATABASE_URL: cannot connect to 127.0.0.1:{port} (connection refused)"
    )


def test_it_names_an_unreachable_redis_in_oz0(tmp_path: Path) -> None:
    port = closed_port()
    env = clean_env(
        DATABASE_URL=os.environ["DATABASE_URL"],
        REDIS_URL=f"redis://127.0.0.1:{port}/0",
        OZ0_DATA_DIR=str(tmp_path),
    )
    assert_one_line(oz0("manage", "check", env=env), f"oz0: REDIS_URL: cannot connect to 127.0.0.1:{port} (connection refused)")


def test_it_names_an_unreachable_database_in_oz0(tmp_path: Path) -> None:
    port = closed_port()
    env = clean_env(
        DATABASE_URL=f"postgres://postgres@127.0.0.1:{port}/oz0", REDIS_URL=settings.REDIS_URL, OZ0_DATA_DIR=str(tmp_path)
    )
    assert_one_line(oz0("test", env=env), f"oz0: DATABASE_URL: cannot connect to 127.0.0.1:{port} (connection refused)")


def test_it_names_a_malformed_database_url_in_oz0(tmp_path: Path) -> None:
    env = clean_env(DATABASE_URL="postgres://", REDIS_URL=settings.REDIS_URL, OZ0_DATA_DIR=str(tmp_path))
    assert_one_line(
        oz0("token", "create", "x", "--workspace", "w", "--role", "viewer", env=env),
        "oz0: DATABASE_URL names no database: add /NAME after the host",
    )


def test_it_names_an_unreachable_redis_in_manage_py() -> None:
    port = closed_port()
    env = clean_env(DATABASE_URL=os.environ["DATABASE_URL"], REDIS_URL=f"redis://127.0.0.1:{port}/0", DEBUG="1")
    result = manage("shell", "-c", "from django.core.cache import cache; cache.get('anything')", env=env)
    assert_one_line(result, f"oz0: REDIS_URL: cannot connect to 127.0.0.1:{port} (connection refused)")
