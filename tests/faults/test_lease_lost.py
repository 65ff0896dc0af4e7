"""A refused late report is recorded: a worker stopped (SIGSTOP) past its lease, then resumed,
reports a call the lease sweep already took from it; the report changes nothing, and the trace
(`lease_lost`, naming the worker) and the worker's log say so."""

from __future__ import annotations

import signal
import time

import pytest

from bench.chaos import Client
from bench.chaos_stack import Stack
from tests.faults.conftest import PROFILE, create, effects, events, run_status, tag, task_row, wait

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(300)]


@pytest.mark.spec("S10")
def test_a_report_after_the_lease_expired_is_refused_and_recorded(stack: Stack, client: Client) -> None:
    stack.stop_process("worker-b")  # worker-a takes the call...
    name = tag()
    run_id = create(client, [{"key": "pay", "kind": "tool", "tool": "test.effect", "args": {"id": name, "seconds": 2}}], "pay")
    wait(lambda: effects(stack, name) == 1, timeout=60, message="the call to run")
    holder = task_row(stack, run_id, "pay")["claim"]
    stack.start("worker-b")  # ...and the other lives on while worker-a is stopped
    stack.signal_group("worker-a", signal.SIGSTOP)
    try:
        wait(lambda: task_row(stack, run_id, "pay")["status"] == "uncertain", timeout=30, message="the sweep to take the call")
    finally:
        stack.signal_group("worker-a", signal.SIGCONT)
    lost = wait(lambda: events(stack, run_id, "lease_lost"), timeout=30, message="the refused report to be recorded")
    (key, _at, data), *_ = lost
    host, pid = holder.split(":")[:2]
    assert key == "pay" and data["worker"] == f"{host}:{pid}" and data["claim"] == holder
    # The report changed nothing: the call stays uncertain for a person, its effect counted once.
    time.sleep(PROFILE.timing.heartbeat * 4)
    assert task_row(stack, run_id, "pay")["status"] == "uncertain" and run_status(stack, run_id) == "needs_attention"
    assert effects(stack, name) == 1
    assert f"worker {host}:{pid} reported task" in stack.log("worker-a", 100_000)
