"""`./oz0 runner` as a real process against a real server on the live stack (S8, S10)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from runs.models import Run, Task
from tests.agents.conftest import assert_test_database
from tests.conftest import ROOT, LiveStack, Team, wait_for

pytestmark = [pytest.mark.live, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def server(live: LiveStack, tmp_path: Path) -> Iterator[str]:
    """daphne serving oz0 on the live stack's test database."""
    assert_test_database()
    port = _free_port()
    log = open(tmp_path / "daphne.log", "wb")  # noqa: SIM115 - the process's log
    proc = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "oz0site.asgi:application"],
        cwd=ROOT,
        env=live.env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"daphne exited {proc.returncode}: {(tmp_path / 'daphne.log').read_text()[-4000:]}")
        try:
            return httpx.get(f"{url}/api/v1/openapi.json", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        # Generous: on a loaded 2-core machine a cold daphne and the first schema render take a while.
        wait_for(up, timeout=120, message="daphne to listen")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
        log.close()


def _runner(live: LiveStack, url: str, token: str, tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    out = tmp_path / f"runner-{time.monotonic_ns()}.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "runner",
            "--url",
            url,
            f"--token={token}",  # `=`: a token may start with `-`, which argparse would take for an option
            "--poll",
            "0.2",
            "--name",
            "test-runner",
            "--tools",
            "test.remote,shell.echo",
        ],
        cwd=ROOT,
        env=live.env,
        stdout=open(out, "wb"),  # noqa: SIM115 - the process's log
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return proc, out


def _create(team: Team, tasks: list[dict[str, Any]], deliverable: str | None = None) -> str:
    body: dict[str, Any] = {"tasks": tasks, **({"deliverable": deliverable} if deliverable else {})}
    status, created = team.api().post(f"/workspaces/{team.slug}/runs", body)
    assert status == 201, created
    return str(created["run"]["id"])


@pytest.mark.spec("S8")
def test_it_serves_calls_from_a_runner_process(live: LiveStack, live_team: Team, server: str, tmp_path: Path) -> None:
    proc, log = _runner(live, server, live_team.tokens["operator"], tmp_path)
    try:
        run_id = _create(
            live_team,
            [
                # Longer than the 5 s lease: only the runner's heartbeats keep it.
                {"key": "remote", "kind": "tool", "tool": "test.remote", "args": {"id": "r", "seconds": 6}},
                {"key": "echo", "kind": "tool", "tool": "shell.echo", "args": {"text": "-n hello; rm -rf /"}},
                {"key": "done", "kind": "join", "mode": "all", "after": ["remote", "echo"]},
            ],
            deliverable="done",
        )
        run = wait_for(
            lambda: Run.objects.filter(pk=run_id, status__in=("completed", "needs_attention", "canceled")).first(),
            timeout=60,
            message="the run",
        )
        assert run.status == "completed", log.read_text()
        tasks = {t.key: t for t in Task.objects.filter(run_id=run_id)}
        assert tasks["remote"].result["value"]["pid"] == proc.pid
        assert tasks["remote"].result["value"]["executor"] == "test-runner"
        assert tasks["echo"].result["value"] == "-n hello; rm -rf /"
        assert "claimed call" in log.read_text()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)


@pytest.mark.spec("S10")
def test_it_makes_a_killed_runners_call_uncertain(live: LiveStack, live_team: Team, server: str, tmp_path: Path) -> None:
    proc, log = _runner(live, server, live_team.tokens["operator"], tmp_path)
    run_id = _create(live_team, [{"key": "remote", "kind": "tool", "tool": "test.remote", "args": {"id": "k", "seconds": 120}}])
    try:
        wait_for(
            lambda: Task.objects.filter(run_id=run_id, key="remote", claim__isnull=False).exists(),
            timeout=30,
            message="the claim",
        )
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=15)
    task = wait_for(
        lambda: Task.objects.filter(run_id=run_id, key="remote", status="uncertain").first(),
        timeout=40,
        message="the lease sweep",
    )
    assert task.error_key == "tool_uncertain"
    run = Run.objects.get(pk=run_id)
    assert run.status == "needs_attention" and run.attention["blocked_task_keys"] == ["remote"]


@pytest.mark.spec("S8")
def test_it_serves_one_call_then_revokes_itself(live: LiveStack, live_team: Team, server: str) -> None:
    from runs.models import Executor

    run_id = _create(live_team, [{"key": "echo", "kind": "tool", "tool": "shell.echo", "args": {"text": "once"}}])
    done = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "runner",
            "--url",
            server,
            # `=`: a token may start with `-`, which argparse would take for an option.
            f"--token={live_team.tokens['operator']}",
            "--poll",
            "0.2",
            "--max-calls",
            "1",
            "--revoke-on-exit",
        ],
        cwd=ROOT,
        env=live.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reported call" in done.stdout and "revoked executor" in done.stdout
    assert Task.objects.get(run_id=run_id, key="echo").result["value"] == "once"
    executor = Executor.objects.filter(owner=live_team.users["operator"]).get()
    assert executor.revoked and executor.tools == ["shell.echo"]


def test_it_refuses_to_serve_a_tool_it_does_not_have(live: LiveStack, live_team: Team, server: str) -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", "runner", "--url", server, f"--token={live_team.tokens['operator']}", "--tools", "rm.rf"],
        cwd=ROOT,
        env=live.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "cannot serve rm.rf" in done.stderr
