"""oz0 behind PgBouncer in transaction pooling (deploy/compose.yaml's shape), against Debian's pgbouncer.

A web process and a worker reach the test database only through a PgBouncer that lends each
transaction one of two server connections: runs created side by side over HTTP all complete with
every task and a gapless trace, a cancel mid-call ends its run, and PgBouncer's own counters
show the traffic went through it, on no more server connections than its pool."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from tests.conftest import LiveStack, Team, wait_for
from tests.foundation.stacks import a_cancel_mid_call_ends_its_run, free_port, runs_complete_side_by_side, web_and_worker

pytestmark = [pytest.mark.live, pytest.mark.slow]

PGBOUNCER = "/usr/sbin/pgbouncer"
SERVER_CONNECTIONS = 2


def _admin(port: int, command: str) -> list[list[str]]:
    """A SHOW command on PgBouncer's admin console (simple protocol: psql)."""
    out = subprocess.run(
        ["psql", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-At", "-F", "\t", "pgbouncer", "-c", command],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    ).stdout
    return [line.split("\t") for line in out.splitlines() if line]


@pytest.fixture
def pgbouncer(live: LiveStack, tmp_path: Path) -> Iterator[int]:
    assert os.path.exists(PGBOUNCER), "Debian's pgbouncer is not installed (.ci/run installs it: apt-get install pgbouncer)"
    # Outside pytest's folders (0700): pgbouncer drops to the postgres user when started as root.
    folder = Path(tempfile.mkdtemp(prefix="oz0-pgbouncer-"))
    folder.chmod(0o755)
    port = free_port()
    settings = connection.settings_dict
    ini = folder / "pgbouncer.ini"
    ini.write_text(
        "[databases]\n"
        f"* = host={settings.get('HOST') or '127.0.0.1'} port={settings.get('PORT') or 5432} user={settings.get('USER') or 'postgres'}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        "auth_type = any\nadmin_users = postgres\n"
        f"pool_mode = transaction\ndefault_pool_size = {SERVER_CONNECTIONS}\nmax_client_conn = 200\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
    )
    ini.chmod(0o644)
    as_user = ["-u", "postgres"] if os.geteuid() == 0 else []
    log = open(tmp_path / "pgbouncer.log", "wb")  # noqa: SIM115 - the process's log
    process = subprocess.Popen([PGBOUNCER, *as_user, str(ini)], stdout=log, stderr=subprocess.STDOUT, cwd=folder)

    def listening() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"pgbouncer exited {process.returncode}: {(tmp_path / 'pgbouncer.log').read_text()[-2000:]}")
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_for(listening, timeout=30, message="pgbouncer to listen")
        yield port
    finally:
        process.terminate()
        process.wait(timeout=15)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def behind_pgbouncer(live: LiveStack, pgbouncer: int, tmp_path: Path) -> Iterator[str]:
    """daphne and a worker (on a queue of their own) whose only way to the database is PgBouncer."""
    url = f"postgres://postgres@127.0.0.1:{pgbouncer}/{connection.settings_dict['NAME']}"
    with web_and_worker(live, url, tmp_path, DB_PGBOUNCER="1") as base:
        yield base


def test_runs_side_by_side_complete_through_transaction_pooling(live_team: Team, pgbouncer: int, behind_pgbouncer: str) -> None:
    runs_complete_side_by_side(behind_pgbouncer, live_team)
    a_cancel_mid_call_ends_its_run(behind_pgbouncer, live_team)

    database = connection.settings_dict["NAME"]
    stats = {row[0]: row for row in _admin(pgbouncer, "SHOW STATS")}
    assert int(stats[database][1]) > 500, stats[database]  # total_xact_count: the traffic went through it
    servers = [row for row in _admin(pgbouncer, "SHOW SERVERS") if database in row]
    assert len(servers) <= SERVER_CONNECTIONS
    clients = [row for row in _admin(pgbouncer, "SHOW CLIENTS") if database in row]
    assert len(clients) > SERVER_CONNECTIONS  # more clients than server connections: pooled per transaction
