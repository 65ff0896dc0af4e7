"""What the chaos stack (bench/chaos_stack.py) and the stack across hosts (bench/hosts.py) share:
oz0's processes started from this checkout with the stack's environment, a log per process in
the stack's work directory, and its database read as the figures need it."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CELERY = [sys.executable, "-m", "celery", "-A", "oz0site"]
# The bench's workers talk to no peer: no gossip nor mingle at start, warnings only in the logs.
QUIET = ["--without-gossip", "--without-mingle", "-l", "warning"]


def daphne(address: str, port: int) -> list[str]:
    return [sys.executable, "-m", "daphne", "-b", address, "-p", str(port), "oz0site.asgi:application"]


def served_settings() -> dict[str, str]:
    """What every bench stack's processes run with beside their addresses: production's settings
    (DEBUG off, a fresh key) over plain HTTP on private addresses, fast password hashes, quiet logs."""
    return {
        "OZ0_PASSWORD_HASHERS": "django.contrib.auth.hashers.MD5PasswordHasher",
        "DEBUG": "0",
        "SECRET_KEY": uuid.uuid4().hex * 2,
        "SECURE_SSL_REDIRECT": "0",
        "SESSION_COOKIE_SECURE": "0",
        "CSRF_COOKIE_SECURE": "0",
        "LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
    }


class ProcessStack:
    """A stack's files, environment and database; the stack says where its database is."""

    def __init__(self, name: str) -> None:
        """A stack called `name`: its work directory, its own Celery queue (a stack never takes
        another's work), the workspace its runs are in; the environment and the token come at `up`."""
        self.workdir = Path(tempfile.mkdtemp(prefix=f"oz0-{name}-"))
        self.queue = f"oz0-{name}-{uuid.uuid4().hex[:8]}"
        self.env: dict[str, str] = {}
        self.token = ""
        self.workspace = name

    @property
    def database_url(self) -> str:
        raise NotImplementedError

    def manage(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
        return done

    def migrate_and_sign_in(self) -> None:
        """The stack's database migrated and an operator's token for its workspace (the driver's)."""
        self.manage("migrate", "--noinput", timeout=600)
        made = self.manage("token_create", f"{self.workspace}-operator", "--workspace", self.workspace, "--role", "operator")
        self.token = made.stdout.strip().splitlines()[-1]

    def log(self, name: str, tail: int = 4000) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    @contextmanager
    def db(self) -> Iterator[Any]:
        import psycopg

        with psycopg.connect(self.database_url, autocommit=True, connect_timeout=5) as conn:
            yield conn

    def query(self, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        with self.db() as conn:
            return list(conn.execute(sql, params).fetchall())
