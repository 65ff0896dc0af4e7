"""Subprocess helpers for the foundation tests: `./oz0` and manage.py as a person runs them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
OZ0 = str(ROOT / "oz0")


def closed_port() -> int:
    """A loopback port nothing listens on (bound, read, released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env(**overrides: str | None) -> dict[str, str]:
    """This process's environment without the pytest/Django bits a child should not inherit."""
    # DJANGO_ALLOW_ASYNC_UNSAFE: browser tests set it in this process; a deployment must not have it.
    leave_out = ("PYTEST_", "DJANGO_SETTINGS_MODULE", "DJANGO_ALLOW_ASYNC_UNSAFE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(leave_out)}
    env["PYTHONUNBUFFERED"] = "1"
    for name, value in overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


# Liveness bounds, not speed targets: `manage.py migrate --check` takes 5 s on an idle machine and
# outlasted 60 s in a CI run with every lane on two slow cores.
def manage(*args: str, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def oz0(*args: str, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([OZ0, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
