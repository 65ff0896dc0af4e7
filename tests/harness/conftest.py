"""Harnessed agents driven offline: the manifest registered through the registry, the run created
through the kernel, and its round run by the worker's own code (`execute_task`: claim, heartbeat,
adapter, report) in a thread, while the test plays the person (approve, deny, answer, cancel)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from agents.registry import register
from runs import kernel
from runs.models import Run, Task
from runs.worker.execution import execute_task
from tests.conftest import Team

NOT_FOUND = [{"kind": "not_found", "description": "The issue does not exist", "person": True}]
SCRIPTED = str(Path(__file__).with_name("scripted_harness.py"))


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
    command: list[str] | None = None,
) -> str:
    env = {"OZ0_TEST_SCRIPT": json.dumps(script)}
    if record is not None:
        env["OZ0_TEST_RECORD"] = str(record)
    harness = {"jsonl": {"command": command or ["python", SCRIPTED], "env": env}}
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
