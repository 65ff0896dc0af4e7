"""What a harness process can reach (F7): the installer chose its code, but it runs confined. It
cannot read the worker's environment or the install's secrets (the system refuses it, since the
tests, like `./oz0 up` here, run as root), starts in a fresh folder of its own with a clean
environment and no descriptors but its three streams, and runs under the install's limits."""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from runs.models import Run, Task
from tests.conftest import Team
from tests.harness.conftest import RECORDS, start_run

SLOW = 60


@pytest.fixture
def secret() -> Any:
    """A secret of the install, as `./oz0` keeps its SECRET_KEY: a file only root may read, here in
    a folder every harness may reach, so only the system's permissions stand between them."""
    path = RECORDS / f"secret_key-{uuid.uuid4().hex}"
    path.write_text("oz0-install-secret-0123456789")
    path.chmod(0o600)
    yield path
    path.unlink(missing_ok=True)


def _probe(team: Team, name: str, program: str, paths: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    harness = {"jsonl": {"program": program, "env": {"OZ0_TEST_PROBE": ",".join(paths), **(env or {})}}}
    manifest = {"name": name, "harness": harness, "tools": [], "approval": {"mode": "bypass"}}
    run, thread = start_run(team, json.dumps(manifest))
    thread.join(SLOW)
    run = Run.objects.get(pk=run.pk)
    assert run.status == "completed", Task.objects.get(run=run, key="r1").error_detail
    facts: dict[str, Any] = run.output
    return facts


def _assert_confined(facts: dict[str, Any], secret: Path, worker_environ: str) -> None:
    assert os.environ.get("DATABASE_URL") and os.environ.get("DATABASE_URL") not in str(facts)
    assert facts["uid"] == facts["euid"] != 0 and facts["groups"] in ([], [facts["uid"]], [65534])
    assert "oz0-install-secret" not in str(facts)
    assert facts["reads"][str(secret)] == {"error": "EACCES"}
    assert facts["reads"][worker_environ]["error"] in ("EACCES", "ENOENT")
    assert {"DATABASE_URL", "SECRET_KEY", "REDIS_URL", "DJANGO_SETTINGS_MODULE"}.isdisjoint(facts["env"])
    assert facts["fds"] == [0, 1, 2, 3]  # its three streams, and the one reading /proc/self/fd
    assert facts["cwd"].startswith(os.path.join(tempfile.gettempdir(), "oz0-harness-")) and not os.path.exists(facts["cwd"])
    assert facts["env"]["HOME"] == facts["env"]["TMPDIR"] == facts["cwd"]


@pytest.mark.spec("F7")
def test_a_harness_in_the_sandbox_cannot_read_the_workers_environment_or_the_installs_secrets(
    harness_team: Team, secret: Path
) -> None:
    worker_environ = f"/proc/{os.getpid()}/environ"
    facts = _probe(harness_team, "probe-bwrap", "probe", [worker_environ, str(secret), "/etc/shadow"])
    _assert_confined(facts, secret, worker_environ)
    assert facts["reads"][worker_environ] == {"error": "ENOENT"}  # the worker is no process of its sandbox
    assert os.getpid() not in facts["pids"]
    assert facts["reads"]["/etc/shadow"] == {"error": "ENOENT"}


@pytest.mark.spec("F7")
def test_a_harness_switched_to_the_harness_user_is_refused_by_the_system(harness_team: Team, secret: Path, settings: Any) -> None:
    """Without bubblewrap (OZ0_HARNESS_SANDBOX=user) the process still runs as OZ0_HARNESS_USER: the
    worker's /proc entry is there, and the system refuses it. (The program's interpreter must be one
    that user may run: the virtualenv's, under root's private home here, is not.)"""
    settings.OZ0_HARNESS_SANDBOX = "user"
    worker_environ = f"/proc/{os.getpid()}/environ"
    facts = _probe(harness_team, "probe-user", "probe-system-python", [worker_environ, str(secret)])
    _assert_confined(facts, secret, worker_environ)
    assert facts["reads"][worker_environ] == {"error": "EACCES"}


@pytest.mark.spec("F7")
def test_a_harness_runs_under_the_installs_limits_and_environment(harness_team: Team, settings: Any) -> None:
    settings.OZ0_HARNESS_CPU_SECONDS = 77
    settings.OZ0_HARNESS_MEMORY_MB = 3000
    settings.OZ0_HARNESS_PROCESSES = 300
    facts = _probe(
        harness_team,
        "probe-limits",
        "installer-env",
        [],
        env={"OZ0_TEST_FROM_MANIFEST": "the manifest's", "OZ0_TEST_SHARED": "manifest"},
    )
    assert facts["limits"] == {"RLIMIT_CPU": 77, "RLIMIT_DATA": 3000 * 1024 * 1024, "RLIMIT_NPROC": 300, "RLIMIT_CORE": 0}
    env = facts["env"]
    assert env["OZ0_TEST_FROM_INSTALLER"] == "the installer's" and env["OZ0_TEST_FROM_MANIFEST"] == "the manifest's"
    assert env["OZ0_TEST_SHARED"] == "installer"  # the installer's word over the manifest's
    assert set(env) <= {
        "PATH",
        "HOME",
        "TMPDIR",
        "LANG",
        "LC_ALL",
        "TZ",
        "PYTHONUNBUFFERED",
        "OZ0_HARNESS_WRITABLE",
        "OZ0_TEST_PROBE",
        "OZ0_TEST_FROM_INSTALLER",
        "OZ0_TEST_FROM_MANIFEST",
        "OZ0_TEST_SHARED",
        "LC_CTYPE",
    }, env


@pytest.mark.spec("F7")
def test_a_machine_that_cannot_confine_a_harness_fails_it_unavailable(harness_team: Team, settings: Any) -> None:
    settings.OZ0_HARNESS_USER = "no-such-user-oz0"
    run, thread = start_run(harness_team, '{"name": "probe-nobody", "harness": {"jsonl": {"program": "probe"}}}')
    thread.join(SLOW)
    round_task = Task.objects.get(run=run, key="r1")
    assert round_task.error_key == "harness_unavailable" and "OZ0_HARNESS_USER" in round_task.error_detail


@pytest.mark.spec("F7", "S22")
def test_a_version_registered_with_a_command_before_programs_runs_nothing(harness_team: Team) -> None:
    """A version stored while manifests could name a command: its round fails typed, and the
    command never runs."""
    from oz0agents.models import Agent, AgentVersion
    from runs import kernel
    from tests.harness.conftest import RoundThread

    marker = RECORDS / f"ran-{uuid.uuid4().hex}"
    harness = {"kind": "jsonl", "command": ["/bin/touch", str(marker)], "env": {}}
    manifest = {"name": "old-command", "model": "harness:jsonl", "tools": [], "failures": [], "harness": harness}
    manifest |= {"approval": {"mode": "bypass", "rules": []}, "instructions": "", "fallback_models": [], "tool_on_failure": {}}
    agent = Agent.objects.create(workspace=harness_team.workspace, name="old-command")
    AgentVersion.objects.create(agent=agent, version=1, manifest_text="", manifest=manifest, digest="0" * 64)
    run, _ = kernel.create_run(
        workspace=harness_team.workspace, user=harness_team.users["operator"], body={"agent": "old-command"}
    )
    RoundThread(run).join(SLOW)
    round_task = Task.objects.get(run=run, key="r1")
    assert round_task.error_key == "harness_unavailable" and "OZ0_HARNESS_PROGRAMS" in round_task.error_detail
    assert not marker.exists()


@pytest.mark.spec("F7")
def test_the_folders_of_harnesses_whose_worker_died_are_removed(harness_team: Team) -> None:
    import subprocess

    gone = subprocess.Popen(["true"])
    gone.wait()
    orphan = Path(tempfile.gettempdir()) / f"oz0-harness-{gone.pid}-r1-orphan"
    orphan.mkdir()
    (orphan / "left").write_text("by a worker that was killed")
    mine = Path(tempfile.mkdtemp(prefix=f"oz0-harness-{os.getpid()}-r9-"))
    try:
        _probe(harness_team, "probe-orphans", "probe", [])
        assert not orphan.exists() and mine.exists()  # a live worker's folder stays
    finally:
        mine.rmdir()


@pytest.mark.spec("F7")
def test_a_rounds_kept_folder_goes_once_its_run_ended_or_is_gone(harness_team: Team) -> None:
    """A round's job folder is kept across its sessions (folders.py); the sweep a session start
    makes removes those of runs that ended, or were pruned, and an open run's no session touched
    for a week, and leaves the others."""
    from oz0agents.registry import register
    from runs import kernel
    from runs.worker.harness import folders
    from runs.worker.harness.sandbox import jobs_folder
    from tests.harness.conftest import jsonl_manifest

    registered = register(jsonl_manifest("kept-folders", [{"done": 1}]), workspace=harness_team.workspace)
    opened, ended = (
        kernel.create_run(workspace=harness_team.workspace, user=harness_team.users["operator"], body={"agent": "kept-folders"})[
            0
        ]
        for _ in range(2)
    )
    assert registered.version.agent.name == "kept-folders"
    kernel.cancel_run(run_id=ended.pk, user=harness_team.users["operator"], reason="done with it")
    ended.refresh_from_db()
    assert ended.status == "canceled"
    named = (("open", opened.pk, "r1"), ("stale", opened.pk, "r2"), ("ended", ended.pk, "r1"), ("gone", uuid.uuid4(), "r1"))
    kept = {name: jobs_folder() / folders.folder_name(run_id, key) for name, run_id, key in named}
    for path in kept.values():
        path.mkdir(exist_ok=True)
        (path / "left").write_text("by an earlier session")
    week_ago = time.time() - folders.KEEP_SECONDS - 60
    os.utime(kept["stale"], (week_ago, week_ago))  # an open run's folder no session touched for a week
    folders._swept = 0.0
    assert folders.sweep() >= 3
    assert kept["open"].exists() and not any(kept[name].exists() for name in ("stale", "ended", "gone"))
    assert folders.sweep() == 0  # at most once a minute
    folders.remove(kept["open"].name)
