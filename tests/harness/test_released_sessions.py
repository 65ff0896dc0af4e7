"""Waits hold nothing, for processes that cannot be parked (issue 29): a JSON-lines session waiting
on a person longer than OZ0_SESSION_PARK_SECONDS keeps its process but gives its thread back. The
session worker's keeper (runs/worker/harness/keeper.py) holds every released session on one event
loop: their pipes read without a thread each, their claims heartbeated together; the decision
gives the session a slot and a thread again and the run completes. The per-workspace slot cap
counts active sessions only. A cancel ends a released session's process; a session worker lost
while its sessions wait loses no run: the lease sweep queues the round again, its call answered
from the journal. Offline, with the scripted JSON-lines program; the session worker's threads
are the test's."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from oz0agents.registry import register
from runs import kernel
from runs.models import Run, Task, TraceEvent
from runs.worker.execution import execute_session
from runs.worker.harness.base import HarnessProtocolError
from runs.worker.harness.channel import READ_CHUNK, UNREAD_MAX
from runs.worker.harness.keeper import keeper
from tests.conftest import Team, wait_for
from tests.harness.conftest import harness_manifest, jsonl_manifest, record_path, records

# The session worker's thread is the parking tests' own: a released session runs on the same one.
from tests.harness.test_parking import SessionThread

SLOW = 60
ASKS = [{"ask": "Ship it?"}, {"done": "$last"}]


@pytest.fixture
def releasing(harness_team: Team, settings: Any) -> Iterator[Team]:
    settings.OZ0_SESSION_PARK_SECONDS = 0.2
    settings.OZ0_SESSION_SLOTS_PER_WORKSPACE = 2
    yield harness_team
    # Whatever a test left released ends with it, and the keeper holds no connection to the test database.
    for claim in list(keeper().sessions):
        left = keeper().drop(claim)
        if left is not None:
            left.stop()
    keeper().database.submit(lambda: connection.close()).result(timeout=SLOW)


def _start(team: Team, name: str, script: list[dict[str, Any]] = ASKS, **kwargs: Any) -> Run:
    registered = register(jsonl_manifest(name, script, **kwargs), workspace=team.workspace)
    run, _ = kernel.create_run(
        workspace=team.workspace, user=team.users["operator"], body={"agent": registered.version.agent.name}
    )
    return run


def _handed_over() -> None:
    """A session hands itself to the keeper as a call on the keeper's loop (`Keeper.take`), which a
    busy machine may not have run when the session's thread has ended: one trip round that loop,
    and every hand-over made before it is done."""
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0), keeper().loop).result(timeout=SLOW)


def _released(run: Run) -> Task:
    """The run's session, started on a session thread, waits on its ask and gave the thread back."""
    session = SessionThread(run)
    session.join()
    assert session.took is True
    _handed_over()
    r1 = Task.objects.get(run=run, key="r1")
    assert r1.status == "running" and r1.claim is not None, (r1.status, r1.error_detail)
    assert r1.state["released"]["on"] == "r1.1"
    assert Task.objects.get(run=run, key="r1.1").status in ("awaiting_input", "needs_approval")
    return r1


# The threads a worker process has whatever it runs, one each: the keeper's loop and database
# thread, the harness spawner, and the process's own (metrics, realtime pushes).
SINGLETONS = ("MainThread", "oz0-session-keeper", "oz0-keeper-db", "oz0-harness-spawner", "oz0-metrics", "oz0-realtime")


def _threads(*, of_keeper: bool = False) -> Any:
    """The threads sessions hold (their names), or the keeper's (its loop and database thread)."""
    if of_keeper:
        return [t.name for t in threading.enumerate() if t.name.startswith(SINGLETONS[1:3])]
    return sorted(t.name for t in threading.enumerate() if not t.name.startswith(SINGLETONS))


def _answer(team: Team, run: Run, value: str) -> None:
    status, body = team.api("operator").post(f"/runs/{run.pk}/tasks/r1.1/answer", {"value": value})
    assert status == 200, body


def _finished(run: Run) -> Run:
    wait_for(
        lambda: Run.objects.get(pk=run.pk).status in ("completed", "failed", "canceled"), timeout=SLOW, message="the run's end"
    )
    run.refresh_from_db()
    return run


def _round_ended(run: Run) -> Task:
    return wait_for(
        lambda: Task.objects.filter(run=run, key="r1").exclude(status="running").first(), timeout=SLOW, message="the round's end"
    )


def _events(run: Run) -> list[tuple[str, Any]]:
    names = ("session_released", "session_reattached", "claim_expired")
    return list(TraceEvent.objects.filter(run=run, event__in=names).order_by("seq").values_list("event", "data"))


@pytest.mark.spec("F7")
def test_waiting_jsonl_sessions_hold_no_thread_nor_slot_and_the_answer_completes_each(releasing: Team) -> None:
    # Threads other tests of this process left running (an executor's idle worker) are not ours.
    before = set(_threads())
    runs = [_start(releasing, "rel-many") for _ in range(5)]
    for run in runs:
        _released(run)  # five sessions wait on people in a workspace of two slots
    # They hold none of the slots, and no thread each: the keeper's loop and its database thread.
    assert kernel.running_sessions(releasing.workspace.pk) == 0
    wait_for(lambda: set(_threads()) <= before, timeout=SLOW, message="threads given back")
    assert len(keeper().sessions) == 5 and len(_threads(of_keeper=True)) == 2
    for index, run in enumerate(runs):
        _answer(releasing, run, f"yes {index}")
    for index, run in enumerate(runs):
        run = _finished(run)
        assert (run.status, (run.output or {})["value"]) == ("completed", f"yes {index}"), Task.objects.get(
            run=run, key="r1"
        ).error_detail
        assert _events(run) == [("session_released", {"on": "r1.1"}), ("session_reattached", {})]
        assert "released" not in Task.objects.get(run=run, key="r1").state
    wait_for(lambda: set(_threads()) <= before, timeout=SLOW, message="the resumed sessions' threads ended")


@pytest.mark.spec("F7")
def test_a_decided_session_waits_for_a_free_slot_before_it_takes_a_thread_again(releasing: Team) -> None:
    run = _start(releasing, "rel-cap")
    _released(run)
    # Two other sessions of the workspace hold both slots.
    busy = [_start(releasing, "rel-busy", [{"done": 1}]) for _ in range(2)]
    held = [kernel.claim_task(str(b.pk), Task.objects.get(run=b, key="r1").pk, f"busy-{i}") for i, b in enumerate(busy)]
    assert kernel.running_sessions(releasing.workspace.pk) == 2
    _answer(releasing, run, "later")
    ticks = keeper().ticks
    wait_for(lambda: keeper().ticks >= ticks + 4, timeout=SLOW, message="the keeper's ticks")
    r1 = Task.objects.get(run=run, key="r1")
    assert r1.status == "running" and "released" in r1.state  # still released: no slot free
    for claimed in held:
        assert isinstance(claimed, kernel.Claimed) and kernel.task_complete(claimed, "done")
    run = _finished(run)
    assert (run.status, (run.output or {})["value"]) == ("completed", "later")


@pytest.mark.spec("F7", "F1")
def test_a_cancel_ends_a_released_sessions_process_and_the_run(releasing: Team) -> None:
    record = record_path()
    run = _start(releasing, "rel-cancel", record=record)
    r1 = _released(run)
    process = keeper().sessions[str(r1.claim)].channel.process
    kernel.cancel_run(run_id=run.pk, user=releasing.users["operator"], reason="stop")
    run = _finished(run)
    assert run.status == "canceled"
    assert Task.objects.get(run=run, key="r1").status == "canceled"
    process.wait(timeout=SLOW)  # its process ended
    assert [m["type"] for m in records(record)] == ["start", "cancel"]


@pytest.mark.spec("F7", "S10")
def test_a_session_worker_lost_while_its_session_waits_loses_no_run(releasing: Team, settings: Any) -> None:
    """The worker dies (its process with it): no heartbeat, and the lease sweep queues the round
    again; the new session's ask answers from the journal (the same r1.1), and the answer completes it."""
    run = _start(releasing, "rel-lost")
    r1 = _released(run)
    lost = keeper().drop(str(r1.claim))
    assert lost is not None
    lost.channel.kill()
    lost.channel.close()
    later = timezone.now() + timedelta(seconds=float(settings.OZ0_LEASE_SECONDS) + 5)
    assert kernel.sweep_expired_claims(later) >= 1
    r1.refresh_from_db()
    assert (r1.status, r1.ready, r1.claim) == ("waiting", True, None)
    _released(run)
    _answer(releasing, run, "after the loss")
    run = _finished(run)
    assert (run.status, (run.output or {})["value"]) == ("completed", "after the loss")
    assert list(Task.objects.filter(run=run, key__startswith="r1.").values_list("key", flat=True)) == ["r1.1"]
    assert [event for event, _ in _events(run)] == ["session_released", "claim_expired", "session_released", "session_reattached"]


def _session_of(team: Team, run: Run) -> dict[str, Any]:
    status, document = team.api("viewer").get(f"/runs/{run.pk}")
    assert status == 200, document
    return {task["key"]: task.get("session", "-") for task in document["tasks"]}


@pytest.mark.spec("F7")
def test_the_run_document_and_page_say_where_the_session_stands(releasing: Team) -> None:
    run = _start(releasing, "rel-doc")
    _released(run)
    # The round's session is released; the ask is no session (no `session` field).
    assert _session_of(releasing, run) == {"r1": "released", "r1.1": "-"}
    client = Client()
    client.force_login(releasing.users["viewer"])
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'data-session="released"' in page and "session released" in page
    _answer(releasing, run, "yes")
    run = _finished(run)
    assert run.status == "completed" and _session_of(releasing, run) == {"r1": None, "r1.1": "-"}
    assert "data-session=" not in client.get(f"/runs/{run.pk}/").content.decode()

    # A session a thread drives is active; one queued behind a full workspace waits for a slot.
    busy = [_start(releasing, "rel-doc-busy", [{"done": 1}]) for _ in range(3)]
    held = [kernel.claim_task(str(b.pk), Task.objects.get(run=b, key="r1").pk, f"doc-{i}") for i, b in enumerate(busy[:2])]
    assert _session_of(releasing, busy[0]) == {"r1": "active"}
    assert _session_of(releasing, busy[2]) == {"r1": "queued"}
    assert execute_session(Task.objects.get(run=busy[2], key="r1").pk, str(busy[2].pk)) is False
    assert _session_of(releasing, busy[2]) == {"r1": "waiting_for_slot"}
    for claimed in held:
        assert isinstance(claimed, kernel.Claimed) and kernel.task_complete(claimed, "done")


@pytest.mark.spec("F7")
def test_time_released_is_not_running_time_the_rounds_deadline_stops(releasing: Team) -> None:
    harness = {"jsonl": {"program": "scripted", "env": {"OZ0_TEST_SCRIPT": json.dumps(ASKS)}}, "timeout_s": 1}
    registered = register(harness_manifest("rel-deadline", harness), workspace=releasing.workspace)
    run, _ = kernel.create_run(
        workspace=releasing.workspace, user=releasing.users["operator"], body={"agent": registered.version.agent.name}
    )
    r1 = _released(run)
    assert r1.deadline_at is None and r1.state["released"]["deadline_left"] > 0
    # Past the round's second of running time, released all along (the keeper's ticks are 0.25 s).
    ticks = keeper().ticks
    wait_for(lambda: keeper().ticks >= ticks + 8, timeout=SLOW, message="the keeper's ticks")
    assert Task.objects.get(pk=r1.pk).status == "running"
    _answer(releasing, run, "in time")
    run = _finished(run)
    assert (run.status, (run.output or {})["value"]) == ("completed", "in time"), Task.objects.get(run=run, key="r1").error_detail


@pytest.mark.spec("F7", "F10")
def test_an_agents_sdk_agent_asking_from_inside_a_function_tool_is_released_and_its_answer_completes_it(
    releasing: Team,
) -> None:
    """The SDK makes no `RunState` inside a tool, so this wait cannot be parked: it is released."""
    manifest = harness_manifest("rel-sdk-asks", {"openai_agents": "oz0_test_sdk_agents:asks"})
    registered = register(manifest, workspace=releasing.workspace)
    run, _ = kernel.create_run(
        workspace=releasing.workspace, user=releasing.users["operator"], body={"agent": registered.version.agent.name}
    )
    r1 = _released(run)
    assert "parked" not in r1.state
    _answer(releasing, run, "oz0")
    run = _finished(run)
    assert run.status == "completed" and "oz0" in str(run.output), Task.objects.get(run=run, key="r1").error_detail
    assert [event for event, _ in _events(run)] == ["session_released", "session_reattached"]


def _start_acp(team: Team, name: str, script: list[dict[str, Any]], **kwargs: Any) -> Run:
    record = kwargs.pop("record", None)
    env = {"OZ0_TEST_SCRIPT": json.dumps(script), **({"OZ0_TEST_RECORD": str(record)} if record else {})}
    registered = register(
        harness_manifest(name, {"acp": {"program": "acp-scripted", "env": env}}, **kwargs), workspace=team.workspace
    )
    run, _ = kernel.create_run(
        workspace=team.workspace, user=team.users["operator"], body={"agent": registered.version.agent.name}
    )
    return run


PERMISSION = {"kind": "execute", "title": "Ship 1.2", "raw_input": {"command": "ship 1.2"}}


@pytest.mark.spec("F7", "S5")
def test_waiting_acp_sessions_hold_no_thread_nor_slot_and_the_decision_completes_each(releasing: Team) -> None:
    """An ACP agent waiting on a person (its own permission request, or `ask` on the `oz0` MCP
    server) is released as a JSON-lines one is: its conversation waits on the keeper's loop."""
    before = set(_threads())
    asks = _start_acp(releasing, "rel-acp-ask", [{"tool": "ask", "args": {"question": "Ship it?"}}, {"say": "$last"}])
    permissions = [
        _start_acp(releasing, "rel-acp-permission", [{"permission": PERMISSION}, {"say": "$last"}], approval="ask")
        for _ in range(3)
    ]
    for run in (asks, *permissions):
        session = SessionThread(run)
        session.join()
        assert session.took is True
        r1 = Task.objects.get(run=run, key="r1")
        assert r1.status == "running" and r1.state.get("released", {}).get("on") == "r1.1", (r1.status, r1.state, r1.error_detail)
    # Four conversations wait in a workspace of two slots, holding none, and no thread each.
    assert kernel.running_sessions(releasing.workspace.pk) == 0
    wait_for(lambda: set(_threads()) <= before, timeout=SLOW, message="threads given back")
    _handed_over()
    assert len(keeper().sessions) == 4 and len(_threads(of_keeper=True)) == 2
    _answer(releasing, asks, "yes")
    for run in permissions:
        kernel.approve(run_id=run.pk, key="r1.1", user=releasing.users["operator"])
    asks = _finished(asks)
    assert (asks.status, asks.output) == ("completed", "yes"), Task.objects.get(run=asks, key="r1").error_detail
    for run in permissions:
        run = _finished(run)
        assert run.status == "completed", Task.objects.get(run=run, key="r1").error_detail
        assert json.loads(run.output) == {"outcome": {"outcome": "selected", "optionId": "once"}}
        assert _events(run) == [("session_released", {"on": "r1.1"}), ("session_reattached", {})]
    wait_for(lambda: set(_threads()) <= before, timeout=SLOW, message="the resumed sessions' threads ended")


@pytest.mark.spec("F7", "F1", "S29")
def test_a_cancel_reaches_a_released_acp_agent_and_ends_the_run(releasing: Team) -> None:
    record = record_path()
    run = _start_acp(releasing, "rel-acp-cancel", [{"permission": PERMISSION}, {"say": "$last"}], approval="ask", record=record)
    _released(run)
    kernel.cancel_run(run_id=run.pk, user=releasing.users["operator"], reason="stop")
    run = _finished(run)
    assert run.status == "canceled" and Task.objects.get(run=run, key="r1").status == "canceled"
    # session/cancel reached it before its permission request was answered `cancelled` (ACP's
    # order): it never took that answer for a person's dismissal and went on with its turn.
    assert [n["event"] for n in records(record) if n["event"] in ("cancel", "answered")] == ["cancel"]


@pytest.mark.spec("F7", "S10")
def test_an_acp_session_lost_while_released_loses_no_run_and_asks_no_second_time(releasing: Team, settings: Any) -> None:
    """Its `ask` is no call with an effect: the lease sweep queues the round again (a permission
    waiting would make it `uncertain`, tests/harness/test_released_live.py)."""
    run = _start_acp(releasing, "rel-acp-lost", [{"tool": "ask", "args": {"question": "Ship it?"}}, {"say": "$last"}])
    r1 = _released(run)
    lost = keeper().drop(str(r1.claim))
    assert lost is not None
    lost.stop()
    later = timezone.now() + timedelta(seconds=float(settings.OZ0_LEASE_SECONDS) + 5)
    assert kernel.sweep_expired_claims(later) >= 1
    _released(run)  # the new session's ask waits on the same r1.1
    _answer(releasing, run, "after the loss")
    run = _finished(run)
    assert (run.status, run.output) == ("completed", "after the loss"), Task.objects.get(run=run, key="r1").error_detail
    assert list(Task.objects.filter(run=run, key__startswith="r1.").values_list("key", flat=True)) == ["r1.1"]


@pytest.mark.spec("F7", "F9")
def test_a_released_harness_that_floods_its_output_is_ended_typed_before_any_decision(releasing: Team) -> None:
    """A released session's unread output is capped (UNREAD_MAX): a JSON-lines program writing on
    while it waits is ended at once, `harness_protocol_error`, its call still the person's."""
    script = [{"send": "oz.ask", "args": {"question": "Ship it?"}}, {"sleep": 2.0}, {"flood": 3 * UNREAD_MAX}, {"wait": True}]
    run = _start(releasing, "rel-flood", script)
    _released(run)
    r1 = _round_ended(run)
    assert (r1.status, r1.error_key) == ("failed", "harness_protocol_error") and "2,097,152 bytes" in r1.error_detail
    assert Task.objects.get(run=run, key="r1.1").status == "awaiting_input"  # the person's, for a retry to wait on
    assert "released" not in r1.state and not keeper().sessions


@pytest.mark.spec("F7", "F9")
def test_a_released_acp_agent_that_floods_its_message_is_ended_typed(releasing: Team) -> None:
    """Released while its permission waits, the agent streams message text far past an output's cap
    (OUTPUT_MAX): the conversation keeps none of it past the cap and is ended at once, typed."""
    flooding = {"permission": PERMISSION, "flood_after": 1.0, "flood": 3 * UNREAD_MAX}
    run = _start_acp(releasing, "rel-acp-flood", [flooding, {"say": "$last"}], approval="ask")
    _released(run)
    r1 = _round_ended(run)
    assert (r1.status, r1.error_key) == ("failed", "harness_protocol_error"), r1.error_detail
    assert "message text" in r1.error_detail and not keeper().sessions


@pytest.mark.spec("F7", "F9")
def test_a_channel_keeps_at_most_its_cap_of_unread_output(tmp_path: Any) -> None:
    """The keeper's reads of a flooding process: what the channel keeps stays under the cap, and
    once past it the channel reads no more and holds the typed failure."""
    import sys

    from runs.worker.harness.channel import Channel
    from runs.worker.harness.sandbox import Confined

    flood = "import sys\nline = b'{\"type\":\"usage\"}' + b' ' * 1000 + b'\\n'\nwhile True: sys.stdout.buffer.write(line)"
    channel = Channel.spawn(Confined([sys.executable, "-c", flood], {}, tmp_path))
    try:
        deadline = time.monotonic() + SLOW
        while channel.out_fd in channel.open_fds and time.monotonic() < deadline:
            channel.read_ready(channel.out_fd)
            assert channel._unread <= UNREAD_MAX + READ_CHUNK
        assert channel.out_fd not in channel.open_fds
        error = channel.ended_early()
        assert isinstance(error, HarnessProtocolError) and error.key == "harness_protocol_error"
        assert sum(len(line) for line in channel.lines if isinstance(line, bytes)) <= UNREAD_MAX + READ_CHUNK
    finally:
        channel.kill()
        channel.close()
