"""Waits hold nothing (issue 29): a framework session waiting on a person longer than
OZ0_SESSION_PARK_SECONDS is parked. Its framework's state (Pydantic AI's messages with the
deferred call, the Agents SDK's `RunState`) is stored on the round, its process ends and its
worker thread is free; the decision wakes the round, and a session worker, any one, resumes it
in a new process: the call answers from its record, the model is not asked again for it, and the
tool's effect happens once. Offline, on Pydantic AI's FunctionModel and the SDK's ScriptedModel in
their bridges; the session worker is the test's thread, gone while the session is parked."""

from __future__ import annotations

import os
import signal
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from oz0agents.registry import register
from runs import kernel
from runs.kernel import call_digest
from runs.models import Run, Task, TraceEvent
from runs.worker.execution import execute_session
from tests.conftest import Team, wait_for
from tests.harness.conftest import RECORDS, RoundThread, harness_manifest, jsonl_manifest, start_run

# Starting a bridge imports its framework (seconds on a busy machine).
SLOW = 90


@pytest.fixture
def parking(harness_team: Team, settings: Any) -> Team:
    settings.OZ0_SESSION_PARK_SECONDS = 0.3
    return harness_team


def _job() -> dict[str, str]:
    name = uuid.uuid4().hex
    return {"asked": str(RECORDS / f"{name}.asked"), "effects": str(RECORDS / f"{name}.effects")}


def _lines(path: str) -> list[str]:
    return Path(path).read_text().splitlines() if Path(path).exists() else []


def _manifest(name: str, harness: dict[str, Any]) -> str:
    return harness_manifest(name, harness, approval="ask")


def _parked(run: Run, thread: RoundThread, sent: list[int], on: str = "r1.1") -> Task:
    """The session parked on `on`: its worker's thread is over, its round waits unclaimed (and
    unsent: `sent` is emptied of the sends so far)."""
    thread.join(SLOW)
    sent.clear()
    r1 = Task.objects.get(run=run, key="r1")
    assert (r1.status, r1.ready, r1.claim, r1.deadline_at) == ("waiting", False, None, None), (r1.status, r1.error_detail)
    assert r1.state["parked"]["on"] == on and "journal_checkpoint" in r1.state
    assert Task.objects.get(run=run, key=on).status in ("needs_approval", "awaiting_input")
    run.refresh_from_db()
    assert run.status == "running"
    return r1


def _events(run: Run, *names: str) -> list[tuple[str, Any]]:
    return list(TraceEvent.objects.filter(run=run, event__in=names).order_by("seq").values_list("event", "data"))


def _approve(team: Team, run: Run) -> None:
    call = Task.objects.get(run=run, key="r1.1")
    digest = call_digest(call.spec["tool"], call.spec["args"])
    status, body = team.api("operator").post(f"/runs/{run.pk}/tasks/r1.1/approve", {"digest": digest})
    assert status == 200, body


def _resumed(run: Run, sent: list[int]) -> Run:
    """The decision woke the round: it is queued for the session workers (the test's list keeps
    the send), and a new session, on a new thread as a restarted worker's would be, finishes it."""
    r1 = Task.objects.get(run=run, key="r1")
    assert r1.status == "waiting" and r1.ready and r1.pk in sent
    RoundThread(run).join(SLOW)
    run.refresh_from_db()
    return run


def _park_then_approve(team: Team, sent: list[int], name: str, harness: dict[str, Any]) -> tuple[Run, dict[str, str]]:
    job = _job()
    run, thread = start_run(team, _manifest(name, harness), job)
    parked = _parked(run, thread, sent)
    assert _lines(job["asked"]) == ["asked"] and _lines(job["effects"]) == []
    # The run's document says so (the run page draws the same field).
    document = team.api("viewer").get(f"/runs/{run.pk}")[1]
    assert [t.get("session") for t in document["tasks"] if t["key"] == "r1"] == ["parked"]
    billed = (parked.result or {})["usage"]
    assert (billed["input_tokens"], billed["output_tokens"], billed["calls"]) == (11, 2, 1)
    _approve(team, run)
    run = _resumed(run, sent)
    assert run.status == "completed", Task.objects.get(run=run, key="r1").error_detail
    assert run.output == "the tool said: shipped 1.2"
    # The effect happened once, and the model was asked twice in all: before the park, and after
    # the tool's answer; never again for the call it had made.
    assert _lines(job["effects"]) == ["shipped 1.2"]
    assert _lines(job["asked"]) == ["asked", "asked"]
    assert list(Task.objects.filter(run=run, key__startswith="r1.").values_list("key", flat=True)) == ["r1.1"]
    assert _events(run, "session_parked", "session_woken", "journal_resumed", "journal_replayed") == [
        ("session_parked", {"on": "r1.1", "at": 1}),
        ("session_woken", {"on": "r1.1"}),
        ("journal_resumed", {"at": 0, "keys": []}),
        ("journal_replayed", {"key": "r1.1", "tool": "oz.approval", "at": 0}),
    ]
    # Both sessions' tokens are billed on the round.
    usage = (Task.objects.get(run=run, key="r1").result or {})["usage"]
    assert (usage["input_tokens"], usage["output_tokens"], usage["calls"]) == (22, 4, 2)
    return run, job


@pytest.mark.spec("F7", "S5", "S10")
def test_a_pydantic_ai_session_waiting_on_an_approval_is_parked_and_the_decision_resumes_it_in_a_new_process(
    parking: Team, no_dispatch: list[int]
) -> None:
    _park_then_approve(parking, no_dispatch, "park-pydantic", {"pydantic_ai": "oz0_test_pydantic_agents:parks"})


@pytest.mark.spec("F7", "S5", "S10")
def test_an_agents_sdk_session_waiting_on_an_approval_is_parked_with_its_run_state_and_resumed_from_it(
    parking: Team, no_dispatch: list[int]
) -> None:
    run, _ = _park_then_approve(parking, no_dispatch, "park-sdk", {"openai_agents": "oz0_test_sdk_agents:parks"})
    checkpoint = Task.objects.get(run=run, key="r1").state["journal_checkpoint"]
    assert checkpoint["at"] == 0 and "openai_agents_state" in checkpoint["state"]


@pytest.mark.spec("F7", "S5", "S10")
def test_a_session_worker_told_to_stop_parks_a_session_waiting_on_a_person_at_once(
    harness_team: Team, no_dispatch: list[int], settings: Any
) -> None:
    """A warm shutdown waits for every session's thread, and a person may take hours: the session
    parks when the worker is told to stop (Celery's signal, as a deploy's SIGTERM sends it), not
    when its park clock runs out, and the decision resumes it on whichever worker is up."""
    from celery import signals

    from runs.worker.harness.base import worker_stopping

    settings.OZ0_SESSION_PARK_SECONDS = 3600.0  # the clock never parks it here
    job = _job()
    run, thread = start_run(harness_team, _manifest("park-stop", {"pydantic_ai": "oz0_test_pydantic_agents:parks"}), job)
    try:
        wait_for(
            lambda: Task.objects.filter(run=run, key="r1.1", status="needs_approval").exists(), timeout=SLOW, message="the ask"
        )
        thread.thread.join(1.0)
        assert thread.thread.is_alive(), "the session parked before the worker was told to stop"
        signals.worker_shutting_down.send(sender="sessions@test", sig="SIGTERM", how="Warm", exitcode=0)
        _parked(run, thread, no_dispatch)
    finally:
        worker_stopping.clear()
    assert _events(run, "session_parked") == [("session_parked", {"on": "r1.1", "at": 1})]
    _approve(harness_team, run)
    run = _resumed(run, no_dispatch)
    assert run.status == "completed", Task.objects.get(run=run, key="r1").error_detail
    assert _lines(job["effects"]) == ["shipped 1.2"] and _lines(job["asked"]) == ["asked", "asked"]


@pytest.mark.spec("F7", "S6")
def test_a_denial_given_while_the_session_is_parked_is_its_answer_and_is_not_asked_again(
    parking: Team, no_dispatch: list[int]
) -> None:
    job = _job()
    run, thread = start_run(parking, _manifest("park-deny", {"pydantic_ai": "oz0_test_pydantic_agents:parks"}), job)
    _parked(run, thread, no_dispatch)
    kernel.deny(run_id=run.pk, key="r1.1", user=parking.users["operator"], reason="not on a Friday")
    run = _resumed(run, no_dispatch)
    assert run.status == "completed", Task.objects.get(run=run, key="r1").error_detail
    assert "not on a Friday" in str(run.output) and _lines(job["effects"]) == []
    assert list(Task.objects.filter(run=run, key__startswith="r1.").values_list("key", flat=True)) == ["r1.1"]


@pytest.mark.spec("F7", "F10")
def test_a_session_waiting_on_a_persons_answer_is_parked_and_the_answer_resumes_it(parking: Team, no_dispatch: list[int]) -> None:
    job = _job()
    harness = {"pydantic_ai": "oz0_test_pydantic_agents:asks_and_parks"}
    run, thread = start_run(parking, _manifest("park-ask", harness), job)
    _parked(run, thread, no_dispatch)
    status, body = parking.api("operator").post(f"/runs/{run.pk}/tasks/r1.1/answer", {"value": "1.3"})
    assert status == 200, body
    run = _resumed(run, no_dispatch)
    assert (run.status, run.output) == ("completed", "answered: 1.3")
    assert _lines(job["asked"]) == ["asked", "asked"]


@pytest.mark.spec("F7")
def test_a_run_canceled_while_its_session_is_parked_ends_canceled_without_waking_it(
    parking: Team, no_dispatch: list[int]
) -> None:
    run, thread = start_run(parking, _manifest("park-cancel", {"pydantic_ai": "oz0_test_pydantic_agents:parks"}), _job())
    r1 = _parked(run, thread, no_dispatch)
    kernel.cancel_run(run_id=run.pk, user=parking.users["operator"])
    run.refresh_from_db()
    assert run.status == "canceled"
    assert Task.objects.get(pk=r1.pk).status == "canceled" and r1.pk not in no_dispatch
    assert _events(run, "session_woken") == []


class SessionThread:
    """A session worker's thread: `execute_session`, under the workspace's cap."""

    def __init__(self, run: Run) -> None:
        self.task_id = Task.objects.get(run=run, key="r1").pk
        self.run_id = str(run.pk)
        self.took: bool | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.took = execute_session(self.task_id, self.run_id)
        finally:
            connection.close()

    def join(self) -> None:
        self.thread.join(SLOW)
        assert not self.thread.is_alive(), "the session kept its thread"


@pytest.mark.spec("F7")
def test_parked_sessions_count_against_no_cap_their_workspace_runs_more_sessions_than_it_has_slots(
    parking: Team, no_dispatch: list[int], settings: Any
) -> None:
    settings.OZ0_SESSION_SLOTS_PER_WORKSPACE = 1
    manifest = _manifest("park-cap", {"pydantic_ai": "oz0_test_pydantic_agents:parks"})
    runs = []
    for _ in range(3):
        run, thread = start_run(parking, manifest, _job())
        _parked(run, thread, no_dispatch)
        runs.append(run)
    # Three sessions wait on people in a workspace of one slot: each one parked took none.
    assert not Task.objects.filter(run__workspace=parking.workspace, kind="round", status="running").exists()
    for run in runs:
        _approve(parking, run)
    sessions = [SessionThread(run) for run in runs]
    for session in sessions:
        session.join()
    # One slot: the sessions take it in turn (one refused while another runs goes back to the queue).
    for run, session in zip(runs, sessions, strict=True):
        while not session.took:
            session = SessionThread(run)
            session.join()
        run.refresh_from_db()
        assert run.status == "completed", Task.objects.get(run=run, key="r1").error_detail


def _kill_bridge(target: str) -> None:
    """Kill the bridge process running `target` (a crash while its session waits on a person)."""
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # The bridge itself (`python …_bridge.py TARGET`), not the sandbox that started it.
        if len(argv) > 2 and argv[1].endswith(b"_bridge.py") and argv[2] == target.encode():
            print("KILL", entry.name, argv, (entry / "status").read_text().splitlines()[:8])
            os.kill(int(entry.name), signal.SIGKILL)
            return
    seen = [
        (e.name, (e / "cmdline").read_bytes()[:300])
        for e in Path("/proc").iterdir()
        if e.name.isdigit() and target.encode() in (e / "cmdline").read_bytes()
    ]
    raise AssertionError(f"no bridge runs {target}: {seen}")


@pytest.mark.spec("F7", "S10")
def test_a_retried_agents_sdk_session_gets_its_run_state_back_and_its_model_is_not_asked_again(
    harness_team: Team, no_dispatch: list[int]
) -> None:
    job = _job()
    target = "oz0_test_sdk_agents:parks_killed"
    run, thread = start_run(harness_team, _manifest("retry-sdk-state", {"openai_agents": target}), job)
    wait_for(lambda: Task.objects.filter(run=run, key="r1.1", status="needs_approval").exists(), timeout=SLOW, message="r1.1")
    wait_for(lambda: "journal_checkpoint" in Task.objects.get(run=run, key="r1").state, timeout=SLOW, message="checkpoint")
    # The bridge dies while its session waits on the approval; the session finds it gone when the
    # decision comes (the answer cannot be sent): the round crashed.
    _kill_bridge(target)
    _approve(harness_team, run)
    thread.join(SLOW)
    r1 = Task.objects.get(run=run, key="r1")
    assert (r1.status, r1.error_key) == ("failed", "harness_crashed"), r1.error_detail
    made = [c["key"] for c in kernel.nonreplayable_calls(r1)]
    status, body = harness_team.api("operator").post(f"/runs/{run.pk}/tasks/r1/retry", {"confirm_calls": made})
    assert status == 200, body
    RoundThread(run).join(SLOW)
    run.refresh_from_db()
    assert (run.status, run.output) == ("completed", "the tool said: shipped 1.2"), Task.objects.get(
        run=run, key="r1"
    ).error_detail
    # The retried session went on from the RunState of the interruption: the model was asked
    # before the crash and once after the tool, never again for the call it had made.
    assert _lines(job["asked"]) == ["asked", "asked"] and _lines(job["effects"]) == ["shipped 1.2"]
    assert _events(run, "journal_resumed", "journal_replayed") == [
        ("journal_resumed", {"at": 0, "keys": []}),
        ("journal_replayed", {"key": "r1.1", "tool": "oz.approval", "at": 0}),
    ]


@pytest.mark.spec("F7")
def test_a_json_lines_session_waiting_on_a_person_keeps_its_process_and_is_never_parked(
    parking: Team, no_dispatch: list[int]
) -> None:
    """Its state is the program's own: the process is kept, only the thread is released
    (tests/harness/test_released_sessions.py)."""
    script: list[dict[str, Any]] = [{"call": "oz.ask", "args": {"question": "Which version?"}}, {"done": "$last"}]
    run, thread = start_run(parking, jsonl_manifest("park-jsonl", script))
    thread.join(SLOW)  # released: the thread is given back
    r1 = Task.objects.get(run=run, key="r1")
    assert r1.status == "running" and r1.claim and "parked" not in r1.state and r1.state["released"]["on"] == "r1.1"
    status, body = parking.api("operator").post(f"/runs/{run.pk}/tasks/r1.1/answer", {"value": "1.3"})
    assert status == 200, body
    wait_for(lambda: Run.objects.get(pk=run.pk).status == "completed", timeout=SLOW, message="the run's end")
    run.refresh_from_db()
    assert (run.output or {}).get("value") == "1.3", run.output
    assert _events(run, "session_parked", "session_woken") == []
    assert [event for event, _ in _events(run, "session_released", "session_reattached")] == [
        "session_released",
        "session_reattached",
    ]


@pytest.mark.spec("F7")
def test_the_kernel_parks_a_round_only_on_a_call_in_a_persons_hands_and_with_a_checkpoint_to_resume_from(
    harness_team: Team, no_dispatch: list[int]
) -> None:
    registered = register(
        _manifest("park-kernel", {"pydantic_ai": "oz0_test_pydantic_agents:parks"}), workspace=harness_team.workspace
    )
    run, _ = kernel.create_run(
        workspace=harness_team.workspace, user=harness_team.users["operator"], body={"agent": registered.version.agent.name}
    )
    r1 = Task.objects.get(run=run, key="r1")
    claimed = kernel.claim_task(run.pk, r1.pk, f"park-host:1:{uuid.uuid4().hex[:8]}")
    assert isinstance(claimed, kernel.Claimed)
    park: dict[str, Any] = {"extra": {"usage": {"input_tokens": 5, "output_tokens": 1, "calls": 1}}, "state": {"authored": 2}}
    assert kernel.round_call(claimed, {"ask": "Which version?"}, allowed_tools=[], tool_policies={}, journal_at=0) == (
        "r1.1",
        None,
    )
    # No checkpoint of its harness to resume from: not parked.
    assert not kernel.round_park(claimed, on="r1.1", at=1, **park)
    assert kernel.round_checkpoint(claimed, {"pydantic_ai_messages": []}, at=0)
    # Not a call in a person's hands: not parked.
    assert not kernel.round_park(claimed, on="r1.9", at=1, **park)
    no_dispatch.clear()
    assert kernel.round_park(claimed, on="r1.1", at=1, **park)
    r1.refresh_from_db()
    assert (r1.status, r1.claim, r1.ready) == ("waiting", None, False) and r1.state["parked"]["on"] == "r1.1"
    assert r1.state["journal"][0]["key"] == "r1.1" and (r1.result or {})["usage"]["input_tokens"] == 5
    # Its claim is gone: whatever the old session reports is refused.
    assert not kernel.round_park(claimed, on="r1.1", at=1, **park)
    assert not kernel.task_complete(claimed, "late")
    assert no_dispatch == []
    kernel.answer(run_id=run.pk, key="r1.1", user=harness_team.users["operator"], value="1.3")
    r1.refresh_from_db()
    assert r1.status == "waiting" and r1.ready and no_dispatch == [r1.pk]
    assert _events(run, "session_parked", "session_woken") == [
        ("session_parked", {"on": "r1.1", "at": 1}),
        ("session_woken", {"on": "r1.1"}),
    ]
