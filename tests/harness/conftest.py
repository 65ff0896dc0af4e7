"""Harnessed agents driven offline: the manifest registered through the registry, the run created
through the kernel, and its round run by the worker's own code (`execute_task`: claim, heartbeat,
adapter, report) in a thread, while the test plays the person (approve, deny, answer, cancel).

The suite is its own installer: its programs (tests/harness/programs.yaml), the modules of
tests/harness/agent_modules/, and a folder every harness may write its records to (RECORDS), set
when this file loads, so the live stack's workers, started later, get them too."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from oz0agents.registry import register
from runs import kernel
from runs.models import Run, Task
from runs.worker.execution import execute_task
from tests.conftest import LiveStack, Team

NOT_FOUND = [{"kind": "not_found", "description": "The issue does not exist", "person": True}]
HERE = Path(__file__).parent
# Folders under /tmp: a harness user may reach them (pytest's own temporary folders are root's alone).
RECORDS = Path(tempfile.mkdtemp(prefix="oz0-harness-records-"))
RECORDS.chmod(0o777)
atexit.register(shutil.rmtree, RECORDS, True)
INSTALLED = {
    "OZ0_HARNESS_PROGRAMS": str(HERE / "programs.yaml"),
    "OZ0_HARNESS_MODULES": "oz0_test_sdk_agents,oz0_test_pydantic_agents",
    "OZ0_AGENT_PATH": str(HERE / "agent_modules"),
    "OZ0_HARNESS_WRITABLE": str(RECORDS),
}
os.environ.update(INSTALLED)
settings.OZ0_HARNESS_PROGRAMS = INSTALLED["OZ0_HARNESS_PROGRAMS"]
settings.OZ0_HARNESS_MODULES = INSTALLED["OZ0_HARNESS_MODULES"].split(",")
settings.OZ0_AGENT_PATH = [INSTALLED["OZ0_AGENT_PATH"]]
settings.OZ0_HARNESS_WRITABLE = [INSTALLED["OZ0_HARNESS_WRITABLE"]]


def record_path() -> Path:
    """A file a harness process may write its record to, and the test read."""
    return RECORDS / f"{uuid.uuid4().hex}.jsonl"


def harness_manifest(
    name: str,
    harness: dict[str, Any],
    *,
    tools: list[str] | None = None,
    approval: str = "bypass",
    failures: list[dict[str, Any]] | None = None,
) -> str:
    manifest = {
        "name": name,
        "instructions": "Do the job.",
        "harness": harness,
        "tools": ["oz.fail", "oz.ask", *(tools or [])],
        "failures": NOT_FOUND if failures is None else failures,
        "approval": {"mode": approval},
    }
    return json.dumps(manifest)  # JSON is YAML


def jsonl_manifest(
    name: str,
    script: list[dict[str, Any]],
    *,
    record: Path | None = None,
    tools: list[str] | None = None,
    approval: str = "bypass",
    failures: list[dict[str, Any]] | None = None,
    program: str = "scripted",
) -> str:
    env = {"OZ0_TEST_SCRIPT": json.dumps(script)}
    if record is not None:
        env["OZ0_TEST_RECORD"] = str(record)
    harness = {"jsonl": {"program": program, "env": env}}
    return harness_manifest(name, harness, tools=tools, approval=approval, failures=failures)


class RoundThread:
    """The worker's execution of the run's first round, in a thread of its own."""

    def __init__(self, run: Run) -> None:
        self.task = Task.objects.get(run=run, key="r1")
        self.run_id = str(run.pk)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            execute_task(self.task.pk, self.run_id)
        except BaseException as error:
            self.error = error
        finally:
            connection.close()

    def join(self, timeout: float = 20) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the harnessed round did not end"
        assert self.error is None, self.error


def start_run(team: Team, manifest: str, run_input: Any = None) -> tuple[Run, RoundThread]:
    registered = register(manifest, workspace=team.workspace)
    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={"agent": registered.version.agent.name, "input": run_input},
    )
    return run, RoundThread(run)


def records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def harness_team(committed: None, no_dispatch: list[int], settings: Any) -> Iterator[Team]:
    """A fresh workspace on the committed database; the kernel's sends kept in a list (the test
    drives the calls itself); heartbeats fast, so a cancel reaches the worker quickly."""
    settings.OZ0_HEARTBEAT_SECONDS = 0.2
    yield Team()


@pytest.fixture
def short_park_sessions(live: LiveStack) -> Iterator[LiveStack]:
    """The session worker started again with a one-second park clock; as it was afterwards."""
    with live.sessions_with(OZ0_SESSION_PARK_SECONDS="1") as restarted:
        yield restarted
