"""Housekeeping does not wait behind the work: with every worker slot busy on long calls, the
sweeps still run (they are beat's own, never messages on the workers' queue), /healthz still calls
the worker alive, and a dead holder's call moves on within the lease plus two sweep periods."""

from __future__ import annotations

import time
from datetime import datetime

import httpx
import pytest

from bench.chaos import Client
from bench.chaos_stack import Stack
from tests.faults.conftest import PROFILE, create, events, tag, task_row, wait

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(300)]

BUSY = 15.0  # seconds every slot stays busy: longer than a lease plus the sweeps' bound


def health(stack: Stack) -> dict[str, object]:
    return dict(httpx.get(f"{stack.base_url}/healthz", timeout=10).json())


@pytest.mark.spec("S10")
def test_a_dead_holders_call_moves_on_in_time_while_every_slot_is_busy(stack: Stack, client: Client) -> None:
    slots = stack.slots * len(stack.WORKERS)
    name = tag()
    run_id = create(
        client,
        [{"key": f"b{i}", "kind": "tool", "tool": "test.sleep", "args": {"seconds": BUSY}} for i in range(slots)]
        + [
            {
                "key": "late",
                "kind": "tool",
                "tool": "test.echo",
                "args": {"value": name},
                "after": [f"b{i}" for i in range(slots)],
            }
        ],
        "late",
    )
    wait(
        lambda: all(task_row(stack, run_id, f"b{i}")["status"] == "running" for i in range(slots)),
        timeout=60,
        message="every slot to be busy",
    )
    # Every slot is busy: killing one worker leaves the other's two slots busy for BUSY seconds.
    killed_at = time.time()
    stack.kill("worker-b")
    polls = []
    while time.time() < killed_at + PROFILE.lease_bound + 3:
        polls.append(health(stack))
        time.sleep(0.5)
    expired = wait(lambda: events(stack, run_id, "claim_expired"), timeout=BUSY, message="the dead holder's claims to expire")
    stack.start("worker-b")
    for _key, at, data in expired:
        # Its holder's last heartbeat was at the latest when it was killed.
        assert at.timestamp() - killed_at <= PROFILE.lease_bound, (at, killed_at, data)
        last_heartbeat = datetime.fromisoformat(data["heartbeat_at"])
        assert (at - last_heartbeat).total_seconds() <= PROFILE.lease_bound, (at, data)
    # The worker that lives was never called stale, however long its slots stayed busy.
    stale = float(stack.env["OZ0_WORKER_STALE_SECONDS"])
    for poll in polls:
        checks = poll["checks"]
        assert isinstance(checks, dict)
        assert checks["worker"]["status"] == "ok" and checks["worker"]["last_seen_seconds_ago"] <= stale, poll
        assert checks["sweeps"]["status"] == "ok", poll
