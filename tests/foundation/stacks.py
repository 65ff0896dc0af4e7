"""A web process and a worker of oz0 started with a database URL of a test's choosing (through a
pooler, as a least-privileged role), each exactly as `./oz0 serve` starts its role."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from oz0cli import processes
from runs.models import Run, Task, TraceEvent
from tests.conftest import ROOT, LiveStack, Team, wait_for
from tests.runs.driver import echo


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def web_and_worker(live: LiveStack, database_url: str, folder: Path, **settings: str) -> Iterator[str]:
    """daphne and a Celery worker on a queue of their own, reaching the database only by
    `database_url`; yields the web process's base URL."""
    queue = f"{live.queue}-{folder.name[-12:]}"
    env = {**live.env, "DATABASE_URL": database_url, "OZ0_QUEUE": queue, "OZ0_WORKER_CONCURRENCY": "2", **settings}
    port = free_port()
    argv = {
        role: processes.command(role, python=sys.executable, host="127.0.0.1", port=port, schedule=folder / "beat", environ=env)
        for role in ("web", "worker")
    }
    argv["worker"] += ["-n", f"{queue}@%h"]
    started = []
    for role in ("web", "worker"):
        role_env = {**env, **(processes.web_environment(env) if role == "web" else {})}
        log = open(folder / f"{role}.log", "wb")  # noqa: SIM115 - the process's log
        started.append(
            subprocess.Popen(argv[role], cwd=ROOT, env=role_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        for process in started:
            if process.poll() is not None:
                logs = "".join((folder / f"{role}.log").read_text()[-2000:] for role in ("web", "worker"))
                raise AssertionError(f"a process exited: {logs}")
        try:
            return httpx.get(f"{base}/healthz", timeout=5).status_code in (200, 503)
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, timeout=120, message="daphne to answer")
        yield base
    finally:
        for process in started:
            os.killpg(process.pid, 15)
        for process in started:
            process.wait(timeout=20)


def runs_complete_side_by_side(base: str, team: Team, *, threads: int = 8, each: int = 4) -> list[str]:
    """Runs of a fan of six calls and a join, created over HTTP from `threads` clients at once:
    every one completes with every task, its trace without a gap."""
    headers = {"Authorization": f"Bearer {team.tokens['operator']}"}
    created: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()

    def create_some() -> None:
        with httpx.Client(base_url=f"{base}/api/v1", headers=headers, timeout=30) as client:
            for _ in range(each):
                tasks = [echo(f"e{i}", i) for i in range(6)] + [echo("all", "done", after=[f"e{i}" for i in range(6)])]
                response = client.post(f"/workspaces/{team.slug}/runs", json={"tasks": tasks, "deliverable": "all"})
                with lock:
                    if response.status_code == 201:
                        created.append(response.json()["run"]["id"])
                    else:
                        errors.append(f"{response.status_code} {response.text[:300]}")

    clients = [threading.Thread(target=create_some) for _ in range(threads)]
    for client in clients:
        client.start()
    for client in clients:
        client.join()
    total = threads * each
    assert errors == [] and len(created) == total

    def all_ended() -> bool:
        return (
            Run.objects.filter(pk__in=created, status__in=("completed", "failed", "needs_attention", "canceled")).count() == total
        )

    wait_for(all_ended, timeout=180, message=f"the {total} runs to end")
    assert set(Run.objects.filter(pk__in=created).values_list("status", flat=True)) == {"completed"}
    assert Task.objects.filter(run_id__in=created).exclude(status="completed").count() == 0
    assert Task.objects.filter(run_id__in=created).count() == total * 7
    for run_id in created:  # every transition's event, none lost or doubled
        seqs = list(TraceEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    return created


def a_cancel_mid_call_ends_its_run(base: str, team: Team) -> None:
    headers = {"Authorization": f"Bearer {team.tokens['operator']}"}
    with httpx.Client(base_url=f"{base}/api/v1", headers=headers, timeout=30) as client:
        sleeping = {"key": "s", "kind": "tool", "tool": "test.sleep", "args": {"seconds": 30}, "after": []}
        response = client.post(f"/workspaces/{team.slug}/runs", json={"tasks": [sleeping]})
        assert response.status_code == 201, response.text
        run_id = response.json()["run"]["id"]
        wait_for(lambda: Task.objects.filter(run_id=run_id, key="s", status="running").exists(), timeout=60, message="s running")
        assert client.post(f"/runs/{run_id}/cancel", json={"reason": "enough"}).status_code in (200, 202)
    wait_for(lambda: Run.objects.get(pk=run_id).status == "canceled", timeout=60, message="the canceled run")
