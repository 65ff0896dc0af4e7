"""Retries resume (issue 29): a harnessed round's calls form a journal, and a session started again
(a person's retry after a crash) is handed it. The same call in the same place answers from its
recorded task instead of running again; a non-replayable call is never made twice; a call the
journal lacks runs. Offline: fake subprocesses speaking JSON-lines, Pydantic AI's FunctionModel and
the Agents SDK's ScriptedModel in their bridges, a scripted ACP agent."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from oz0agents.registry import register
from runs import kernel
from runs.models import Run, Task, TraceEvent
from tests.conftest import Team, wait_for
from tests.harness.conftest import RECORDS, RoundThread, harness_manifest, record_path, records, start_run
from tests.runs.driver import drive
from testtools.models import EffectRecord


def _effects(effect: str) -> int:
    return EffectRecord.objects.filter(effect_id=effect).count()


def _drive_until(run: Run, key: str) -> None:
    """The session waits on its call `key`: run it (and what came before it) on the test's worker."""
    wait_for(lambda: Task.objects.filter(run=run, key=key).exists(), timeout=30, message=key)
    drive(run)


def _crashed(run: Run, thread: RoundThread) -> Task:
    thread.join(30)
    r1 = Task.objects.get(run=run, key="r1")
    assert (r1.status, r1.error_key) == ("failed", "harness_crashed"), r1.error_detail
    return r1


def _retried(team: Team, run: Run) -> RoundThread:
    """A person retries the crashed round, confirming the non-replayable calls it made, and the
    worker runs its session again."""
    r1 = Task.objects.get(run=run, key="r1")
    made = [c["key"] for c in kernel.nonreplayable_calls(r1)]
    status, body = team.api("operator").post(f"/runs/{run.pk}/tasks/r1/retry", {"confirm_calls": made} if made else {})
    assert status == 200, body
    return RoundThread(run)


def _journal_events(run: Run) -> list[tuple[str, Any]]:
    return [
        (e, d)
        for e, d in TraceEvent.objects.filter(run=run, event__startswith="journal_").order_by("seq").values_list("event", "data")
    ]


def _sessions_file() -> Path:
    return RECORDS / f"{uuid.uuid4().hex}.sessions"


def _scripted(name: str, script: list[dict[str, Any]], *, tools: list[str], protocol: int = 1, record: Path | None = None) -> str:
    env = {"OZ0_TEST_SCRIPT": json.dumps(script), "OZ0_TEST_SESSIONS": str(_sessions_file())}
    if record is not None:
        env["OZ0_TEST_RECORD"] = str(record)
    program = {"program": "scripted", "env": env, **({"protocol": protocol} if protocol != 1 else {})}
    return harness_manifest(name, {"jsonl": program}, tools=tools)


@pytest.mark.spec("F7", "S10")
def test_a_retried_jsonl_session_answers_its_recorded_call_from_the_journal_and_the_effect_happens_once(
    harness_team: Team,
) -> None:
    effect = uuid.uuid4().hex
    script: list[dict[str, Any]] = [
        {"call": "test.effect", "args": {"id": effect}},
        {"session": 1, "crash": 3, "stderr": "lost my footing"},
        {"call": "test.echo", "args": {"value": "after the crash"}},
        {"done": "$last"},
    ]
    run, thread = start_run(harness_team, _scripted("jr-jsonl", script, tools=["test.effect", "test.echo"]))
    _drive_until(run, "r1.1")
    r1 = _crashed(run, thread)
    assert _effects(effect) == 1 and r1.state["journal"] == [
        {"key": "r1.1", "tool": "test.effect", "digest": kernel.call_digest("test.effect", {"id": effect})}
    ]
    thread = _retried(harness_team, run)
    _drive_until(run, "r1.2")
    thread.join(30)
    run.refresh_from_db()
    assert run.status == "completed", run.status
    assert _effects(effect) == 1  # the effect of r1.1 was not made again
    assert (Task.objects.get(run=run, key="r1").result or {})["value"] == {
        "ok": True,
        "value": "after the crash",
        "id": "c",
        "type": "result",
    }
    assert sorted(Task.objects.filter(run=run, key__startswith="r1.").values_list("key", flat=True)) == ["r1.1", "r1.2"]
    assert _journal_events(run) == [("journal_replayed", {"key": "r1.1", "tool": "test.effect", "at": 0})]
    assert [e["key"] for e in Task.objects.get(run=run, key="r1").state["journal"]] == ["r1.1", "r1.2"]


@pytest.mark.spec("F7")
def test_protocol_2_hands_the_journal_in_start_and_protocol_1_gets_the_start_it_was_written_for(harness_team: Team) -> None:
    for protocol in (2, 1):
        effect = uuid.uuid4().hex
        script: list[dict[str, Any]] = [
            {"call": "test.effect", "args": {"id": effect}},
            {"session": 1, "crash": 3},
            {"done": "$last"},
        ]
        record = record_path()
        manifest = _scripted(f"jr-v{protocol}", script, tools=["test.effect"], protocol=protocol, record=record)
        run, thread = start_run(harness_team, manifest)
        _drive_until(run, "r1.1")
        _crashed(run, thread)
        _retried(harness_team, run).join(30)
        run.refresh_from_db()
        assert run.status == "completed" and _effects(effect) == 1, (protocol, run.status)
        starts = [m for m in records(record) if m["type"] == "start"]
        assert [s["protocol"] for s in starts] == [protocol, protocol]
        if protocol == 1:
            assert all("journal" not in s for s in starts)
            continue
        assert starts[0]["journal"] == []
        value = (Task.objects.get(run=run, key="r1.1").result or {})["value"]
        assert starts[1]["journal"] == [
            {
                "tool": "test.effect",
                "digest": kernel.call_digest("test.effect", {"id": effect}),
                "result": {"ok": True, "value": value},
            }
        ]


@pytest.mark.spec("F7")
def test_a_protocol_2_program_resumes_from_its_checkpoint_past_the_calls_it_holds(harness_team: Team) -> None:
    effect, record = uuid.uuid4().hex, record_path()
    checkpoint = {"type": "checkpoint", "state": {"thought": "the effect is made", "next": "echo"}}
    script: list[dict[str, Any]] = [
        {"session": 1, "call": "test.effect", "args": {"id": effect}},
        {"session": 1, "raw": json.dumps(checkpoint)},
        {"session": 2, "raw": json.dumps({"type": "resumed"})},
        {"call": "test.echo", "args": {"value": "echoed once"}},
        {"session": 1, "crash": 3},
        {"done": "$last"},
    ]
    manifest = _scripted("jr-checkpoint", script, tools=["test.effect", "test.echo"], protocol=2, record=record)
    run, thread = start_run(harness_team, manifest)
    _drive_until(run, "r1.1")
    _drive_until(run, "r1.2")
    r1 = _crashed(run, thread)
    assert r1.state["journal_checkpoint"] == {"at": 1, "state": checkpoint["state"]}
    _retried(harness_team, run).join(30)
    run.refresh_from_db()
    assert run.status == "completed" and _effects(effect) == 1
    starts = [m for m in records(record) if m["type"] == "start"]
    assert "resume" not in starts[0] and starts[1]["resume"] == {"at": 1, "state": checkpoint["state"]}
    assert [t["tool"] for t in starts[1]["journal"]] == ["test.effect", "test.echo"]
    # It resumed past r1.1, which its checkpoint holds; its next call answered from r1.2.
    assert _journal_events(run) == [
        ("journal_resumed", {"at": 1, "keys": ["r1.1"]}),
        ("journal_replayed", {"key": "r1.2", "tool": "test.echo", "at": 1}),
    ]
    assert sorted(Task.objects.filter(run=run, key__startswith="r1.").values_list("key", flat=True)) == ["r1.1", "r1.2"]


@pytest.mark.spec("F7", "S10")
def test_a_diverging_session_runs_replayable_calls_for_real_and_never_makes_a_recorded_non_replayable_call_twice(
    harness_team: Team,
) -> None:
    replayable, once, new = uuid.uuid4().hex, uuid.uuid4().hex, uuid.uuid4().hex
    script: list[dict[str, Any]] = [
        {"session": 1, "call": "test.effect_replayable", "args": {"id": replayable}},
        {"session": 1, "call": "test.effect", "args": {"id": once}},
        {"session": 1, "crash": 3},
        # The second session diverges at once: another call in the first place.
        {"call": "test.echo", "args": {"value": "a different start"}},
        {"call": "test.effect_replayable", "args": {"id": replayable}},
        {"call": "test.effect", "args": {"id": once}},
        {"call": "test.effect", "args": {"id": new}},
        {"done": "$last"},
    ]
    tools = ["test.effect", "test.effect_replayable", "test.echo"]
    run, thread = start_run(harness_team, _scripted("jr-diverge", script, tools=tools))
    _drive_until(run, "r1.1")
    _drive_until(run, "r1.2")
    _crashed(run, thread)
    assert (_effects(replayable), _effects(once)) == (1, 1)
    thread = _retried(harness_team, run)
    for key in ("r1.3", "r1.4", "r1.5"):
        _drive_until(run, key)
    thread.join(30)
    run.refresh_from_db()
    assert run.status == "completed", run.status
    # The replayable call after the divergence ran for real; the recorded non-replayable one was
    # answered from r1.2; the new non-replayable one ran once, as new.
    assert (_effects(replayable), _effects(once), _effects(new)) == (2, 1, 1)
    calls = dict(Task.objects.filter(run=run, key__startswith="r1.").values_list("key", "spec__tool"))
    assert calls == {
        "r1.1": "test.effect_replayable",
        "r1.2": "test.effect",
        "r1.3": "test.echo",
        "r1.4": "test.effect_replayable",
        "r1.5": "test.effect",
    }
    assert Task.objects.get(run=run, key="r1.5").spec["args"] == {"id": new}
    assert _journal_events(run) == [
        ("journal_diverged", {"at": 0, "superseded": ["r1.1", "r1.2"], "by": "r1.3"}),
        ("journal_replayed", {"key": "r1.2", "tool": "test.effect", "at": 2}),
    ]
    state = Task.objects.get(run=run, key="r1").state
    assert [e["key"] for e in state["journal"]] == ["r1.3", "r1.4", "r1.2", "r1.5"]
    assert [e["key"] for e in state["journal_superseded"]] == ["r1.1"]


def _framework_session_resumes(team: Team, name: str, harness: dict[str, Any], run_input: Any, effect: str) -> Run:
    """The agent makes test.effect, then crashes; a person's retry runs it again: the effect is
    answered from the journal, and the session finishes."""
    run, thread = start_run(team, harness_manifest(name, harness, tools=["test.effect"]), run_input)
    _drive_until(run, "r1.1")
    _crashed(run, thread)
    assert _effects(effect) == 1
    _retried(team, run).join(30)
    run.refresh_from_db()
    assert run.status == "completed", (run.status, Task.objects.get(run=run, key="r1").error_detail)
    assert _effects(effect) == 1
    assert list(Task.objects.filter(run=run, key__startswith="r1.").values_list("key", flat=True)) == ["r1.1"]
    replayed = [(e, d) for e, d in _journal_events(run) if e == "journal_replayed"]
    assert replayed == [("journal_replayed", {"key": "r1.1", "tool": "test.effect", "at": 0})]
    return run


@pytest.mark.spec("F7", "S10")
def test_a_retried_pydantic_ai_session_gets_its_recorded_call_answered_and_finishes(harness_team: Team) -> None:
    effect = uuid.uuid4().hex
    asked = RECORDS / f"{effect}.asked"
    job = {"effect": effect, "marker": str(RECORDS / f"{effect}.crashed"), "asked": str(asked)}
    harness = {"pydantic_ai": "oz0_test_pydantic_agents:effect_then_crash_once"}
    run = _framework_session_resumes(harness_team, "jr-pydantic", harness, job, effect)
    value = (Task.objects.get(run=run, key="r1.1").result or {})["value"]
    assert run.output == f"made {json.dumps(value)}"
    # It got its message history back: the second session went on from the model's call of
    # test.effect (answered from the journal) and asked its model once, not twice again.
    assert asked.read_text().splitlines() == ["asked"] * 3
    assert _journal_events(run)[0] == ("journal_resumed", {"at": 0, "keys": []})


@pytest.mark.spec("F7", "S10")
def test_a_retried_agents_sdk_session_gets_its_recorded_call_answered_and_finishes(harness_team: Team) -> None:
    effect = uuid.uuid4().hex
    job = {"effect": effect, "marker": str(RECORDS / f"{effect}.crashed")}
    harness = {"openai_agents": "oz0_test_sdk_agents:effect_then_crash_once"}
    run = _framework_session_resumes(harness_team, "jr-sdk", harness, job, effect)
    assert run.output == json.dumps((Task.objects.get(run=run, key="r1.1").result or {})["value"])


@pytest.mark.spec("F7", "S10")
def test_a_retried_acp_session_gets_its_recorded_call_answered_and_finishes(harness_team: Team) -> None:
    effect = uuid.uuid4().hex
    script = [
        {"tool": "test__effect", "args": {"id": effect}},
        {"once": str(RECORDS / f"{effect}.crashed"), "crash": 3},
        {"say": "$last"},
    ]
    harness = {"acp": {"program": "acp-scripted", "env": {"OZ0_TEST_SCRIPT": json.dumps(script)}}}
    run = _framework_session_resumes(harness_team, "jr-acp", harness, None, effect)
    assert run.output == json.dumps({"id": effect})  # r1.1's recorded answer, as its MCP tool gave it


@pytest.mark.spec("F7", "S10")
def test_a_session_whose_worker_was_lost_is_retried_and_its_recorded_call_is_not_made_again(harness_team: Team) -> None:
    effect = uuid.uuid4().hex
    script: list[dict[str, Any]] = [{"call": "test.effect", "args": {"id": effect}}, {"done": "$last"}]
    registered = register(_scripted("jr-lost", script, tools=["test.effect"]), workspace=harness_team.workspace)
    run, _ = kernel.create_run(
        workspace=harness_team.workspace, user=harness_team.users["operator"], body={"agent": registered.version.agent.name}
    )
    claimed = kernel.claim_task(run.pk, Task.objects.get(run=run, key="r1").pk, f"lost-host:1:{uuid.uuid4().hex[:8]}")
    assert isinstance(claimed, kernel.Claimed)
    # The session's first call, as its worker made it (the session's own kernel call), then the worker dies.
    call = {"tool": "test.effect", "args": {"id": effect}}
    assert kernel.round_call(claimed, call, allowed_tools=["test.effect"], tool_policies={}, journal_at=0) == ("r1.1", None)
    drive(run)
    kernel.sweep_expired_claims(timezone.now() + timedelta(seconds=settings.OZ0_LEASE_SECONDS + 1))
    assert Task.objects.get(run=run, key="r1").status == "uncertain" and _effects(effect) == 1
    _retried(harness_team, run).join(30)
    run.refresh_from_db()
    assert run.status == "completed" and _effects(effect) == 1
    assert (run.output or {})["value"] == {"id": effect}
    assert _journal_events(run) == [("journal_replayed", {"key": "r1.1", "tool": "test.effect", "at": 0})]
