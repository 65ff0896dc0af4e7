"""`./oz0 up` keeps oz0 running: a child that dies (worker, beat, session worker, web) is started
again with backoff and the person is told; the embedded Redis and PostgreSQL too; and after a stop
it starts again at once on the same port (its connections' TIME_WAIT does not stop it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.conftest import wait_for
from tests.foundation.helpers import clean_env, closed_port, oz0
from tests.foundation.test_up import Up, fetch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def children_of(up: Up) -> dict[str, psutil.Process]:
    """The supervisor's children by what they run."""
    found: dict[str, psutil.Process] = {}
    for child in psutil.Process(up.process.pid).children():
        try:
            line = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "daphne" in line:
            found["web"] = child
        elif " beat" in line:
            found["beat"] = child
        elif "sessions@" in line:
            found["sessions"] = child
        elif " worker" in line:
            found["worker"] = child
        elif "redis-server" in line:
            found["redis"] = child
    return found


def stop(up: Up) -> int:
    if up.process.poll() is None:
        up.process.send_signal(signal.SIGINT)
    try:
        return up.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(up.process.pid, signal.SIGKILL)
        raise


def health(base: str) -> dict[str, object]:
    try:
        return dict(json.loads(fetch(f"{base}/healthz")[1]))
    except (OSError, ValueError):  # the web process is starting again
        return {}


def run_completes(base: str, token: str) -> bool:
    body = json.dumps({"tasks": [{"key": "t", "kind": "tool", "tool": "clock.now", "args": {}}], "deliverable": "t"}).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    status, answer = fetch(f"{base}/api/v1/workspaces/demo/runs", data=body, headers=headers)
    assert status == 201, answer
    run = json.loads(answer)["run"]["id"]

    def done() -> bool:
        request = urllib.request.Request(f"{base}/api/v1/runs/{run}", headers=headers)
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())["status"] == "completed"

    return bool(wait_for(done, timeout=120, interval=0.3, message="the run to complete"))


def test_it_restarts_what_dies_and_starts_again_at_once_after_a_stop(embedded_data: Path) -> None:
    port = closed_port()
    data = embedded_data
    env = clean_env(
        DATABASE_URL=None,
        REDIS_URL=None,
        DEBUG=None,
        SECRET_KEY=None,
        TEST_DATABASE_NAME=None,
        OZ0_QUEUE=None,
        OZ0_DATA_DIR=str(data),
        OZ0_PORT=str(port),
        OZ0_HOST="127.0.0.1",
        OZ0_TEST_TOOLS=None,
    )
    base = f"http://127.0.0.1:{port}"
    up = Up(env)
    try:
        wait_for(lambda: "the console is at" in up.output or up.process.poll() is not None, timeout=300, message="the console")
        assert up.process.poll() is None, up.output
        token = oz0("token", "create", "restart-robot", "--workspace", "demo", "--role", "operator", env=env).stdout.split()[-1]

        # Each child killed: it is started again, and the person is told.
        for name in ("worker", "beat", "sessions", "web"):
            before = children_of(up)[name]
            os.killpg(before.pid, signal.SIGKILL)
            wait_for(lambda name=name: f"{name} exited with code" in up.output, timeout=60, message=f"{name}'s exit told")
            wait_for(
                lambda name=name, before=before: (c := children_of(up).get(name)) is not None and c.pid != before.pid,
                timeout=60,
                message=f"{name} started again",
            )
            wait_for(lambda name=name: f"{name} started again" in up.output, timeout=60, message=f"{name}'s restart told")
        wait_for(lambda: health(base).get("status") == "ok", timeout=120, message="the web again")
        assert run_completes(base, token)

        # The embedded Redis and PostgreSQL killed: each started again on its port, with its data.
        children_of(up)["redis"].kill()
        wait_for(lambda: "the embedded Redis is running again" in up.output, timeout=120, message="Redis again")
        postmaster = int((data / "pg" / "postmaster.pid").read_text().split()[0])
        server = psutil.Process(postmaster)
        processes = [server, *server.children(recursive=True)]
        for process in processes:
            process.kill()
        # Crash recovery after a SIGKILL: on a loaded machine it outlasted pg_ctl's 60 s wait.
        try:
            wait_for(lambda: "the embedded PostgreSQL is running again" in up.output, timeout=330, message="PostgreSQL again")
        except AssertionError as timed_out:
            raise AssertionError(f"{timed_out}; oz0 up said:\n{up.output[-4000:]}") from None
        wait_for(lambda: health(base).get("status") == "ok", timeout=180, message="everything healthy again")
        assert run_completes(base, token)
        assert up.process.poll() is None, up.output
    finally:
        code = stop(up)
    assert code == 0, up.output
    lingering = [
        c for c in psutil.net_connections("tcp") if c.status == psutil.CONN_TIME_WAIT and c.laddr and c.laddr.port == port
    ]
    assert lingering, "the stop left no connection in TIME_WAIT: this would prove nothing"

    # Started again at once: the connections the requests above left in TIME_WAIT do not stop it.
    again = Up(env)
    try:
        wait_for(lambda: "the console is at" in again.output or again.process.poll() is not None, timeout=300, message="up again")
        assert again.process.poll() is None and "Address already in use" not in again.output, again.output
    finally:
        assert stop(again) == 0, again.output
