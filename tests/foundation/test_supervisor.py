"""The supervisor of `./oz0 up`, in-process: restarts with backoff, and a port check that the
connections of a stopped `up` in TIME_WAIT do not fail."""

from __future__ import annotations

import socket
import sys
import time
from typing import Any

import psutil
import pytest

from oz0cli import Fatal
from oz0cli.supervisor import MAX_BACKOFF, Supervisor, backoff


def test_the_pause_before_a_restart_doubles_up_to_a_ceiling() -> None:
    assert [backoff(n) for n in (1, 2, 3, 4)] == [1, 2, 4, 8]
    assert backoff(40) == MAX_BACKOFF


def test_a_child_that_exits_is_started_again_and_the_person_told(capsys: pytest.CaptureFixture[str], monkeypatch: Any) -> None:
    supervisor = Supervisor({})
    monkeypatch.setattr("oz0cli.supervisor.backoff", lambda failures: 0.0)
    supervisor.start("brief", [sys.executable, "-c", "print('hello')"])
    first = supervisor.child("brief").process
    assert first is not None
    first.wait(10)
    deadline = time.monotonic() + 10
    while supervisor.child("brief").process is first and time.monotonic() < deadline:
        supervisor.tend()
        time.sleep(0.05)
    assert supervisor.child("brief").process is not first
    supervisor.stop()
    out = capsys.readouterr().out
    assert "brief exited with code 0; restarting it in 0s" in out and "brief started again (restart 1)" in out


def test_the_web_socket_is_not_stopped_by_connections_in_time_wait() -> None:
    from oz0cli.processes import web_socket

    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server's side closes first, as daphne does: its end lingers in TIME_WAIT
    time.sleep(0.1)
    client.close()
    server.close()
    lingering = [
        c for c in psutil.net_connections("tcp") if c.status == psutil.CONN_TIME_WAIT and c.laddr and c.laddr.port == port
    ]
    assert lingering
    # Without SO_REUSEADDR: "OZ0_PORT: cannot listen on ... (Address already in use)".
    listening = web_socket("127.0.0.1", port)
    try:
        assert listening.getsockname()[1] == port and listening.get_inheritable()
    finally:
        listening.close()


def test_the_web_socket_refuses_a_port_another_program_listens_on() -> None:
    from oz0cli.processes import web_socket

    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(Fatal, match=f"OZ0_PORT: cannot listen on 127.0.0.1:{port}"):
            web_socket("127.0.0.1", port)


class RecoveringPostmaster:
    """What the pid file says while a postmaster replays its log after a crash: `starting` for a
    while, then `ready`."""

    def __init__(self, polls_until_ready: int) -> None:
        self.status = "starting"
        self.polls_until_ready = polls_until_ready
        self.process = object()

    def read(self) -> RecoveringPostmaster:
        self.polls_until_ready -= 1
        if self.polls_until_ready <= 0:
            self.status = "ready"
        return self


def test_a_postgresql_restart_waits_for_a_recovery_that_outlasts_pg_ctl_and_launches_no_second_server(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """pg_ctl gives up waiting after 60 s while the postmaster it started goes on recovering: the
    restart waits for that one to be ready, and never starts another over it."""
    from oz0cli.embedded import EmbeddedPostgres

    postgres = EmbeddedPostgres(tmp_path)
    postgres.port = 54_321
    running: list[RecoveringPostmaster] = []
    launches: list[int] = []

    def launch(pg: Any) -> None:
        launches.append(postgres.port)
        running.append(RecoveringPostmaster(polls_until_ready=3))
        raise RuntimeError("pg_ctl: server did not start in time")

    monkeypatch.setattr(postgres, "_launch", launch)
    monkeypatch.setattr(postgres, "_running_info", lambda: running[0].read() if running else None)
    monkeypatch.setattr("oz0cli.embedded.pgserver_modules", lambda: (None, None))

    postgres.restart()

    assert launches == [54_321]
    assert running[0].status == "ready" and postgres.owned
    assert postgres.state.read()["port"] == 54_321


def test_a_postgresql_restart_that_never_gets_ready_says_so(tmp_path: Any, monkeypatch: Any) -> None:
    from oz0cli import Fatal, embedded

    postgres = embedded.EmbeddedPostgres(tmp_path)
    attempts: list[int] = []

    def launch(pg: Any) -> None:
        attempts.append(1)
        raise RuntimeError("pre-existing shared memory block is still in use")

    monkeypatch.setattr(postgres, "_launch", launch)
    monkeypatch.setattr(postgres, "_running_info", lambda: None)
    monkeypatch.setattr(embedded, "pgserver_modules", lambda: (None, None))
    monkeypatch.setattr(embedded, "RESTART_SECONDS", -1)

    with pytest.raises(Fatal, match="did not start again"):
        postgres.restart()
    assert attempts == [1]


def test_a_person_stopping_up_ends_a_postgresql_restart_that_is_still_waiting(tmp_path: Any, monkeypatch: Any) -> None:
    """A Ctrl-C while PostgreSQL recovers is not held for the restart's whole 300 s."""
    from oz0cli import Fatal, embedded

    postgres = embedded.EmbeddedPostgres(tmp_path)
    asked: list[int] = []

    def stopping() -> bool:
        asked.append(1)
        return len(asked) >= 2

    def launch(pg: Any) -> None:
        raise RuntimeError("pg_ctl: server did not start in time")

    monkeypatch.setattr(postgres, "_launch", launch)
    monkeypatch.setattr(postgres, "_running_info", lambda: None)
    monkeypatch.setattr(embedded, "pgserver_modules", lambda: (None, None))

    with pytest.raises(Fatal, match="did not start again"):
        postgres.restart(give_up=stopping)
    assert len(asked) == 2  # asked only while the 300 s had not run out: the stop ended it


def test_a_start_beside_another_oz0_starting_the_same_postgresql_waits_for_it_and_launches_none(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """Two `./oz0` commands at once on one embedded PostgreSQL: the second finds its postmaster
    `starting` and waits for it to be ready, never starting a second server over it."""
    from oz0cli import embedded

    postgres = embedded.EmbeddedPostgres(tmp_path)
    postmaster = RecoveringPostmaster(polls_until_ready=4)
    postmaster.port = 54_322  # type: ignore[attr-defined]
    launches: list[int] = []
    monkeypatch.setattr(embedded, "pgserver_modules", lambda: (None, None))
    monkeypatch.setattr(postgres, "_init", lambda pg, utils: None)
    monkeypatch.setattr(postgres, "_running_info", postmaster.read)
    monkeypatch.setattr(postgres, "_launch", lambda pg: launches.append(1))
    monkeypatch.setattr(postgres, "_create_database", lambda: None)
    monkeypatch.setattr(postgres.state, "owner_alive", lambda: True)  # the other ./oz0 owns it

    assert postgres.start() == "postgres://postgres@127.0.0.1:54322/oz0"
    assert launches == [] and postmaster.status == "ready" and not postgres.owned
