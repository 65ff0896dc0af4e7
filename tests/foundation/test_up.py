"""`./oz0 up` on the EMBEDDED services: no DATABASE_URL / REDIS_URL, a data directory of its own.

It must serve the console and a websocket, move runs through its worker, and stop cleanly.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_for
from tests.foundation.helpers import OZ0, ROOT, clean_env, closed_port, oz0

SESSION_SCRIPT = """
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth.models import User
from django.contrib.sessions.backends.db import SessionStore
user = User.objects.get(username="demo-operator")
session = SessionStore()
session[SESSION_KEY] = str(user.pk)
session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
session[HASH_SESSION_KEY] = user.get_session_auth_hash()
session.create()
print(session.session_key)
"""


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def fetch(url: str, *, data: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    opener = urllib.request.build_opener(NoRedirect)
    request = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with opener.open(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


STOP_BOUND_SECONDS = 120
# Past anything an idle machine needs (about 20 s to the console): a bound for a machine whose
# cores are all busy, not a speed target.
UP_BOUND_SECONDS = 300


class Up:
    def __init__(self, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [OZ0, "up"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in iter(self.process.stdout.readline, b""):
            self.lines.append(raw.decode(errors="replace").rstrip())

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, predicate: Any, what: str) -> Any:
        """`wait_for` with what `up` printed when it times out."""
        try:
            return wait_for(predicate, timeout=UP_BOUND_SECONDS, message=what)
        except AssertionError as error:
            raise AssertionError(f"{error}\n`up` printed:\n{self.output[-6000:]}") from None


async def websocket_receives_a_change(url: str, cookie: str, origin: str, trigger: Any) -> dict[str, Any]:
    import websockets

    async with websockets.connect(url, additional_headers={"Cookie": cookie, "Origin": origin}, open_timeout=60) as ws:
        await asyncio.get_running_loop().run_in_executor(None, trigger)
        while True:
            message = json.loads(await asyncio.wait_for(ws.recv(), timeout=120))
            if message.get("type") == "run.changed" and message.get("status") == "completed":
                return message


@pytest.mark.slow
def test_it_comes_up_on_embedded_services_and_stops_cleanly(embedded_data: Path) -> None:
    port = closed_port()
    data = embedded_data
    env = clean_env(
        DATABASE_URL=None,
        REDIS_URL=None,
        DEBUG=None,  # production-shaped: DEBUG off, static files from whitenoise
        SECRET_KEY=None,
        TEST_DATABASE_NAME=None,
        OZ0_QUEUE=None,
        OZ0_DATA_DIR=str(data),
        OZ0_PORT=str(port),
        OZ0_HOST="127.0.0.1",
        OZ0_TEST_TOOLS=None,  # a real install: `up` without --demo installs no test tools
    )
    base = f"http://127.0.0.1:{port}"
    up = Up(env)
    try:
        # How long it takes is not this test's to judge: about 20 s on an idle machine (README), and
        # minutes on a CI machine whose cores are all busy with the other lanes.
        up.wait_for(lambda: "the console is at" in up.output or up.process.poll() is not None, "the console")
        assert up.process.poll() is None, up.output
        assert f"{base}/" in up.output
        assert "demo-operator" in up.output  # the login details

        status, _ = fetch(f"{base}/")
        assert status in (200, 302)
        status, _ = fetch(f"{base}/login/")
        assert status in (200, 302)
        status, body = fetch(f"{base}/static/vendor/htmx/htmx-2.0.11.min.js")
        assert status == 200 and b"htmx" in body
        health = up.wait_for(
            lambda: (lambda r: r if json.loads(r[1])["checks"]["worker"]["status"] == "ok" else None)(fetch(f"{base}/healthz")),
            "the worker heartbeat",
        )
        assert health[0] == 200

        # A second ./oz0 shares the embedded services of the running one.
        session = oz0("manage", "shell", "-c", SESSION_SCRIPT, env=env)
        assert session.returncode == 0, session.stderr
        session_key = session.stdout.strip().splitlines()[-1]
        token_result = oz0("token", "create", "up-robot", "--workspace", "demo", "--role", "operator", env=env)
        assert token_result.returncode == 0, token_result.stderr
        token = token_result.stdout.strip().splitlines()[-1]

        def post_run(tool: str) -> tuple[int, bytes]:
            body = json.dumps({"tasks": [{"key": "hi", "kind": "tool", "tool": tool, "args": {}}]}).encode()
            return fetch(
                f"{base}/api/v1/workspaces/demo/runs",
                data=body,
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )

        # The processes run as the app role of the embedded PostgreSQL, never its superuser.
        roles_script = (
            "from django.db import connection; c = connection.cursor(); "
            'c.execute("SELECT usename, rolsuper FROM pg_stat_activity JOIN pg_roles ON rolname = usename '
            'WHERE datname = current_database() AND pid <> pg_backend_pid()"); print(sorted(set(c.fetchall())))'
        )
        seen = oz0("manage", "shell", "-c", roles_script, env=env)
        assert seen.returncode == 0, seen.stderr
        assert seen.stdout.strip().splitlines()[-1] == "[('oz0_app', False)]", up.output

        status, answer = post_run("test.echo")
        assert status == 400 and json.loads(answer)["error"]["key"] == "unknown_tool"

        def create_run() -> None:
            status, answer = post_run("clock.now")
            assert status == 201, answer

        # A thread of its own: an earlier test (Playwright's sync API) may leave this thread's loop running.
        with ThreadPoolExecutor(1) as pool:
            message = pool.submit(
                asyncio.run,
                websocket_receives_a_change(
                    f"ws://127.0.0.1:{port}/ws/workspaces/demo/", f"sessionid={session_key}", base, create_run
                ),
            ).result(timeout=240)
        assert message["status"] == "completed"
    finally:
        if up.process.poll() is None:
            up.process.send_signal(signal.SIGINT)
        try:
            # Past every bound of its own: 13 s for the children, 10 s for Redis, 60 s for PostgreSQL.
            code = up.process.wait(timeout=STOP_BOUND_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(up.process.pid, signal.SIGKILL)
            raise AssertionError(f"`up` did not stop within {STOP_BOUND_SECONDS}s:\n{up.output[-4000:]}") from None
    assert code == 0, up.output
    assert "stopped" in up.output
    assert not (data / "pg" / "postmaster.pid").exists(), "the embedded PostgreSQL is still running"
    assert not (data / "redis" / "server.json").exists(), "the embedded Redis is still running"
