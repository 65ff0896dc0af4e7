"""What a harnessed round keeps however it ends, and a workspace's session cap (issue 25, item 8):
stderr is kept on cancel and on oz.fail, tokens are billed on oz.fail and on a crash, a session
waiting for a slot says so in the run's document and page, and the per-workspace cap is hard."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from oz0agents.registry import register
from runs import kernel
from runs.models import Task, TraceEvent
from runs.worker import execution
from tests.conftest import Team, wait_for
from tests.harness.conftest import harness_manifest, jsonl_manifest, record_path, records, start_run
from tests.runs.driver import drive

SLOW = 90


@pytest.mark.spec("F7", "F11")
def test_stderr_is_kept_on_oz_fail_and_on_cancel(harness_team: Team) -> None:
    failed, thread = start_run(harness_team, jsonl_manifest("jl-err-fail", [{"fail": {"kind": "not_found", "message": "no"}}]))
    thread.join()
    assert "started on r1" in Task.objects.get(run=failed, key="r1").result["stderr"]
    record = record_path()
    canceled, thread = start_run(harness_team, jsonl_manifest("jl-err-cancel", [{"wait": True}], record=record))
    wait_for(lambda: records(record), timeout=30, message="the harness's start")
    kernel.cancel_run(run_id=canceled.pk, user=harness_team.users["operator"], reason="stop")
    thread.join()
    round_task = Task.objects.get(run=canceled, key="r1")
    assert round_task.status == "canceled" and "started on r1" in round_task.result["stderr"]


@pytest.mark.spec("F7", "F6")
def test_tokens_are_billed_on_oz_fail_and_on_a_crash(harness_team: Team) -> None:
    for attribute, status, expected in (
        ("fails_after_a_call", "canceled", {"input_tokens": 18, "output_tokens": 7, "calls": 2}),
        # The request that raised is a model call too (as a failed attempt is in oz0's own loop).
        ("crashes_after_a_call", "needs_attention", {"input_tokens": 11, "output_tokens": 5, "calls": 2}),
    ):
        manifest = harness_manifest(
            f"pa-{attribute}", {"pydantic_ai": f"oz0_test_pydantic_agents:{attribute}"}, tools=["test.echo"]
        )
        run, thread = start_run(harness_team, manifest)
        wait_for(lambda run=run: Task.objects.filter(run=run, key="r1.1").exists(), timeout=SLOW, message="r1.1")
        drive(run)
        thread.join(SLOW)
        run.refresh_from_db()
        round_task = Task.objects.get(run=run, key="r1")
        assert run.status == status, (attribute, round_task.error_key, round_task.error_detail)
        assert round_task.result["usage"] == expected, attribute


def _blocking_sessions(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], threading.Event]:
    """Sessions that hold their thread until released (the harness itself is not run)."""
    entered: list[int] = []
    release = threading.Event()

    def held(claimed: kernel.Claimed, cancel: threading.Event) -> None:
        entered.append(claimed.task_id)
        release.wait(30)
        kernel.task_stopped(claimed)

    monkeypatch.setattr(execution, "execute_claimed", held)
    return entered, release


@pytest.mark.spec("F7")
def test_the_per_workspace_session_cap_is_hard_under_concurrent_claims(
    harness_team: Team, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.OZ0_SESSION_SLOTS_PER_WORKSPACE = 8
    entered, release = _blocking_sessions(monkeypatch)
    registered = register(jsonl_manifest("jl-cap", []), workspace=harness_team.workspace)
    runs = [
        kernel.create_run(
            workspace=harness_team.workspace, user=harness_team.users["operator"], body={"agent": registered.version.agent.name}
        )[0]
        for _ in range(12)
    ]
    rounds = [Task.objects.get(run=run, key="r1") for run in runs]
    start = threading.Barrier(len(rounds))
    started: dict[int, bool] = {}

    def claim(task: Task) -> None:
        try:
            start.wait()
            started[task.pk] = execution.execute_session(task.pk, str(task.run_id))
        finally:
            connection.close()

    threads = [threading.Thread(target=claim, args=(task,), daemon=True) for task in rounds]
    for thread in threads:
        thread.start()
    wait_for(lambda: len(started) == 4 and len(entered) == 8 or len(entered) > 8, timeout=30, message="the claims")
    try:
        assert len(entered) == 8, f"{len(entered)} of 8 sessions ran at once"
        assert sorted(started.values()) == [False] * 4
        # Each session left waiting says so: in the trace, the run's document and its page.
        waiting = next(task for task in rounds if task.pk not in entered)
        assert TraceEvent.objects.filter(run_id=waiting.run_id, task_key="r1", event="session_waiting").count() == 1
        status, document = harness_team.api("viewer").get(f"/runs/{waiting.run_id}")
        assert status == 200 and document["waiting_for_slot"]["task"] == "r1" and document["waiting_for_slot"]["slots"] == 8
        client = Client()
        client.force_login(harness_team.users["viewer"])
        assert "Waiting for a session slot" in client.get(f"/runs/{waiting.run_id}/").content.decode()
        holding = next(task for task in rounds if task.pk in entered)
        assert harness_team.api("viewer").get(f"/runs/{holding.run_id}")[1]["waiting_for_slot"] is None
    finally:
        release.set()
        for thread in threads:
            thread.join(30)
    # A slot freed: the waiting session is claimed, and no longer says it waits.
    assert execution.execute_session(waiting.pk, str(waiting.run_id)) is True
    assert harness_team.api("viewer").get(f"/runs/{waiting.run_id}")[1]["waiting_for_slot"] is None
