"""A process gives up on a database host that has answered nothing for DB_DEAD_PEER_SECONDS (a cut
network, a host gone without a word) instead of waiting the many minutes TCP would: its database
socket carries keepalives and a TCP user timeout. Read back from the socket itself."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from django.conf import settings
from django.db import connection

from oz0site.config import dead_peer_options

ROOT = settings.BASE_DIR


@pytest.mark.django_db
def test_a_process_s_database_socket_gives_up_on_a_silent_peer() -> None:
    assert settings.DB_DEAD_PEER_SECONDS == 30.0  # the default
    connection.ensure_connection()
    with socket.socket(fileno=os.dup(connection.connection.pgconn.socket)) as sock:
        if sock.family == socket.AF_UNIX:
            pytest.skip("the database is reached over a Unix socket here: no network peer to lose")
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 15
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 5
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
        # Data sent and not acknowledged for 30 s ends the connection (Linux's TCP_USER_TIMEOUT).
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 30_000


def test_the_options_scale_with_the_setting_and_zero_leaves_tcp_alone() -> None:
    assert dead_peer_options(12) == {
        "keepalives": 1,
        "keepalives_idle": 6,
        "keepalives_interval": 2,
        "keepalives_count": 3,
        "tcp_user_timeout": 12_000,
    }
    assert dead_peer_options(1)["keepalives_interval"] == 1  # never 0 s apart
    assert dead_peer_options(0) == {}


def options_under(**environment: str) -> dict[str, object]:
    # The settings a process reads at its start; no app needs loading for them.
    script = "from django.conf import settings; import json; print(json.dumps(settings.DATABASES['default']['OPTIONS']))"
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, **environment},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_database_url_s_own_values_win_and_zero_turns_them_off() -> None:
    url = os.environ["DATABASE_URL"]
    given = options_under(DATABASE_URL=f"{url}{'&' if '?' in url else '?'}keepalives_idle=7")
    assert str(given["keepalives_idle"]) == "7" and given["tcp_user_timeout"] == 30_000
    off = options_under(DB_DEAD_PEER_SECONDS="0")
    assert not {"keepalives", "keepalives_idle", "tcp_user_timeout"} & set(off)
