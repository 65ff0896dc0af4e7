"""Harnessed rounds have a deadline (issue 25, item 4): the manifest's `harness.timeout_s`, else
OZ0_ROUND_TIMEOUT_SECONDS (30 minutes). Past it the round ends `round_timeout` (kind `timeout`) and
its process (group) is killed at once; the kernel's own clock ends a round whose worker could not."""

from __future__ import annotations

import json
import os
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from oz0agents.lint import lint
from oz0agents.registry import register
from runs import kernel
from runs.models import Run, Task
from tests.conftest import Team, wait_for
from tests.harness.conftest import harness_manifest, record_path, records, start_run


def _processes_holding(marker: str) -> list[int]:
    """The processes on this machine whose environment holds `marker` (the harness and its children)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _timed_out(run: Run) -> Task:
    run.refresh_from_db()
    round_task = Task.objects.get(run=run, key="r1")
    assert (round_task.status, round_task.error_key) == ("timed_out", "round_timeout"), round_task.error_detail
    assert round_task.claim is None and run.status == "needs_attention"
    assert run.failure["kind"] == "timeout" and run.attention["blocked_task_keys"] == ["r1"]
    return round_task


@pytest.mark.spec("F7", "S22")
def test_a_hung_jsonl_harness_ends_round_timeout_at_its_manifests_deadline_and_its_process_is_killed(
    harness_team: Team,
) -> None:
    record = record_path()
    env = {"OZ0_TEST_SCRIPT": json.dumps([{"wait": True, "ignore_cancel": True}]), "OZ0_TEST_RECORD": str(record)}
    manifest = harness_manifest("jl-hung", {"jsonl": {"program": "scripted", "env": env}, "timeout_s": 2})
    run, thread = start_run(harness_team, manifest)
    wait_for(lambda: records(record), timeout=30, message="the harness's start")
    started = time.monotonic()
    thread.join(30)
    assert time.monotonic() - started < 6  # the deadline (2 s), then killed with no grace
    round_task = _timed_out(run)
    assert "deadline of 2 s" in round_task.error_detail
    assert "started on r1" in round_task.result["stderr"]  # what it wrote is kept
    # Killed, never sent a `cancel`. Inside the sandbox the agent dies with bwrap (its parent-death
    # signal), a moment after the group's SIGKILL: under load it may first read the end of its
    # input, closed once the round is over, and record `eof`.
    seen = [m["type"] for m in records(record)]
    assert seen[0] == "start" and "cancel" not in seen and set(seen) <= {"start", "eof"}, seen
    assert _processes_holding(str(record)) == []
    # Not re-run blind: a hung agent would hang again.
    assert Task.objects.get(run=run, key="r1").state.get("auto_retries") is None


@pytest.mark.spec("F7")
def test_the_default_deadline_is_the_setting_and_reaches_a_bridged_agent(harness_team: Team, settings: Any) -> None:
    settings.OZ0_ROUND_TIMEOUT_SECONDS = 3
    run, thread = start_run(harness_team, harness_manifest("pa-hung", {"pydantic_ai": "oz0_test_pydantic_agents:slow"}))
    thread.join(90)
    round_task = _timed_out(run)
    assert "deadline of 3 s" in round_task.error_detail


@pytest.mark.spec("F7")
def test_the_default_round_deadline_is_thirty_minutes() -> None:
    assert django_settings.OZ0_ROUND_TIMEOUT_SECONDS == 30 * 60 or "OZ0_ROUND_TIMEOUT_SECONDS" in os.environ


@pytest.mark.spec("F7")
def test_the_kernels_clock_ends_a_round_whose_worker_did_not(harness_team: Team) -> None:
    manifest = harness_manifest("jl-stuck", {"jsonl": {"program": "scripted"}, "timeout_s": 120})
    registered = register(manifest, workspace=harness_team.workspace)
    run, _ = kernel.create_run(
        workspace=harness_team.workspace, user=harness_team.users["operator"], body={"agent": registered.version.agent.name}
    )
    claimed = kernel.claim_task(run.pk, Task.objects.get(run=run, key="r1").pk, f"stuck:1:{uuid.uuid4().hex[:6]}")
    assert claimed is not None
    round_task = Task.objects.get(run=run, key="r1")
    assert round_task.deadline_at is not None
    grace = (round_task.deadline_at - round_task.started_at).total_seconds()
    assert 120 < grace <= 120 + 60  # the worker's own deadline, then the kernel's grace
    kernel.sweep_clocks(timezone.now() + timedelta(seconds=100))
    assert Task.objects.get(pk=round_task.pk).status == "running"  # the worker's own deadline comes first
    kernel.sweep_clocks(timezone.now() + timedelta(seconds=200))
    round_task.refresh_from_db()
    assert round_task.cancel_requested and round_task.error_detail.startswith("the round ran past its deadline")
    _timed_out(run)
    assert kernel.task_complete(claimed, "too late") is False  # the worker's late report is refused


@pytest.mark.spec("F7")
@pytest.mark.parametrize("value", ["0", "-5", '"ten"', "true", "40000000"])
def test_lint_refuses_a_timeout_that_is_not_a_positive_number_of_seconds(value: str) -> None:
    linted = lint(f"name: a\nharness: {{jsonl: {{program: scripted}}, timeout_s: {value}}}\n")
    assert [e.field for e in linted.errors] == ["harness.timeout_s"], linted.errors


@pytest.mark.spec("F7")
def test_lint_keeps_a_timeout_beside_any_kind_and_refuses_it_inside_a_program() -> None:
    for line, expected in (
        (
            "harness: {jsonl: {program: scripted}, timeout_s: 90}",
            {"kind": "jsonl", "program": "scripted", "env": {}, "timeout_s": 90},
        ),
        (
            'harness: {pydantic_ai: "oz0_test_pydantic_agents:echo", timeout_s: 1.5}',
            {"kind": "pydantic_ai", "target": "oz0_test_pydantic_agents:echo", "timeout_s": 1.5},
        ),
    ):
        linted = lint(f"name: a\n{line}\n")
        assert linted.errors == [] and linted.manifest is not None and linted.manifest["harness"] == expected, linted.errors
    inside = lint("name: a\nharness: {jsonl: {program: scripted, timeout_s: 90}}\n")
    assert inside.errors and "beside the kind" in inside.errors[0].message
