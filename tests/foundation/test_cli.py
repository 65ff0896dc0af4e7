"""`./oz0` refuses what it cannot do with one line and exit code 2."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.foundation.helpers import clean_env, oz0


def test_it_refuses_an_unknown_command(tmp_path: Path) -> None:
    result = oz0("frobnicate", env=clean_env(OZ0_DATA_DIR=str(tmp_path)))
    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == "oz0: unknown command 'frobnicate'"
    assert "./oz0 up" not in result.stdout and "usage: ./oz0 COMMAND" in result.stderr


def test_it_prints_usage_for_help(tmp_path: Path) -> None:
    result = oz0("--help", env=clean_env(OZ0_DATA_DIR=str(tmp_path)))
    assert result.returncode == 0
    for command in (
        "up",
        "test",
        "token create",
        "bench",
        "plugin lint",
        "job search",
        "insights agent",
        "eval run",
        "runner",
        "manage",
    ):
        assert f"  {command}" in result.stdout


def test_it_refuses_a_bad_port(tmp_path: Path) -> None:
    result = oz0("up", env=clean_env(OZ0_DATA_DIR=str(tmp_path), OZ0_PORT="eighty"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["oz0: OZ0_PORT must be a port number, not 'eighty'"]


def test_it_refuses_a_taken_port(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = oz0("up", env=clean_env(OZ0_DATA_DIR=str(tmp_path), OZ0_PORT=str(port)))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"oz0: OZ0_PORT: cannot listen on 127.0.0.1:{port} (Address already in use)"]
    assert "Traceback" not in result.stdout + result.stderr
