"""A 10-second PostgreSQL outage (every server process killed, then started again) with calls in
flight: nothing is lost, nothing runs twice, nothing is reported falsely.

- the heartbeat threads reconnect (a live call's claim does not expire, so a replayable call is
  not run a second time beside itself and a non-replayable one is not made `uncertain`);
- the calls' reports are retried until the database is back, and the calls complete;
- messages the workers take while the database is away wait for it, never acknowledged as failed.
"""

from __future__ import annotations

import time

import pytest

from bench.chaos import Client
from bench.chaos_stack import Stack
from tests.faults.conftest import PROFILE, create, effects, events, run_status, tag, task_row, wait

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(600)]

STAY = 25.0  # the long calls outlive the outage (10 s, plus PostgreSQL's restart) by some heartbeats
OUTAGE = 10.0


@pytest.mark.spec("S10")
def test_calls_in_flight_survive_a_database_outage(stack: Stack, client: Client) -> None:
    # One worker (2 slots) holds the two long calls; the other starts during the outage.
    stack.stop_process("worker-b")
    name = tag()
    long_run = create(
        client,
        [
            {"key": "eff", "kind": "tool", "tool": "test.effect", "args": {"id": f"{name}-eff", "seconds": STAY}},
            {"key": "rep", "kind": "tool", "tool": "test.effect_replayable", "args": {"id": f"{name}-rep", "seconds": STAY}},
        ],
        "rep",
    )
    wait(
        lambda: effects(stack, f"{name}-eff") == 1 and effects(stack, f"{name}-rep") == 1,
        timeout=60,
        message="both long calls to run",
    )
    # Six more calls, queued in Redis behind the two that fill worker-a's slots.
    queued_run = create(
        client, [{"key": f"s{i}", "kind": "tool", "tool": "test.sleep", "args": {"seconds": 0.2}} for i in range(6)], "s0"
    )
    wait(lambda: stack.redis_queue_length() >= 4, timeout=30, message="the calls to wait in the broker")

    stack.postgres.kill()
    down_at = time.time()
    stack.start("worker-b")  # takes queued messages while the database is away
    time.sleep(OUTAGE)
    stack.postgres.restart()
    back_at = time.time()

    wait(lambda: run_status(stack, long_run) in ("completed", "needs_attention"), timeout=90, message="the long run to settle")
    wait(lambda: run_status(stack, queued_run) == "completed", timeout=90, message="the queued run to complete")
    eff, rep = task_row(stack, long_run, "eff"), task_row(stack, long_run, "rep")
    assert (eff["status"], rep["status"]) == ("completed", "completed"), (eff, rep, stack.log("worker-a"))
    assert run_status(stack, long_run) == "completed"
    # Each effect ran once: no claim expired, no call was handed on while it still ran.
    assert effects(stack, f"{name}-eff") == 1 and effects(stack, f"{name}-rep") == 1
    assert events(stack, long_run, "claim_expired") == []
    assert eff["attempt"] == rep["attempt"] == 1
    # The heartbeat threads reconnected: they proved the claims alive after the database came back.
    assert eff["heartbeat_at"].timestamp() > back_at and rep["heartbeat_at"].timestamp() > back_at
    # The queued calls were each claimed once, none acknowledged as failed on the way.
    for i in range(6):
        assert task_row(stack, queued_run, f"s{i}")["attempt"] == 1
    log = stack.log("worker-b", 200_000)
    assert "raised unexpected" not in log, log[-3000:]
    assert down_at < back_at
    assert PROFILE.timing.lease < OUTAGE  # the outage outlasts a lease: the grace after it is what held
