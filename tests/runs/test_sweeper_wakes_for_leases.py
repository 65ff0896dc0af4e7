"""The sweeper wakes for a lease's end: between two passes it sweeps the claims alone when a held
call's lease runs out, so a dead holder's call moves on at its lease, not up to a period later.
Before, a lease that ran out just after a pass waited for the next (the chaos run's session phase
once acted 6.1 s after the last heartbeat, over its bound of the lease plus two periods)."""

from __future__ import annotations

import itertools
import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from runs import kernel
from runs.models import Task, TraceEvent
from runs.worker.periodic import Sweeper
from tests.conftest import Team, wait_for
from tests.runs.driver import task
from tests.runs.test_sweeps_beside_busy_runs import claimed_call


@pytest.mark.spec("S10")
@pytest.mark.django_db
def test_the_next_leases_end_is_read_as_the_claims_sweep_measures_it() -> None:
    now = timezone.now()
    lease = float(settings.OZ0_LEASE_SECONDS)
    assert kernel.seconds_to_next_claim_expiry(now) is None  # nothing held

    run = claimed_call(Team())
    Task.objects.filter(run=run).update(heartbeat_at=now - timedelta(seconds=lease - 0.25))
    assert kernel.seconds_to_next_claim_expiry(now) == pytest.approx(0.25)
    # An outage the sweeper could not see through lengthens the lease it waits for as well.
    assert kernel.seconds_to_next_claim_expiry(now, grace=3) == pytest.approx(3.25)

    # A lease already past is the sweep's now, not a wake: a run the sweep had to pass over (its
    # row locked) cannot keep the sweeper waking.
    Task.objects.filter(run=run).update(heartbeat_at=now - timedelta(seconds=lease + 1))
    assert kernel.seconds_to_next_claim_expiry(now) is None
    assert kernel.seconds_to_next_claim_expiry(now, grace=3) == pytest.approx(2.0)


@pytest.mark.spec("S10")
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_the_sweeper_hands_a_dead_holders_call_on_at_its_lease_not_at_its_next_pass(settings: Any) -> None:
    settings.OZ0_SWEEP_SECONDS = 90
    settings.OZ0_LEASE_SECONDS = 1.0
    run = claimed_call(Team())  # heartbeated now; its holder never will again
    sweeper = Sweeper().start()  # its first pass finds the lease running; the next is 90 s away
    try:
        wait_for(lambda: task(run, "a").status == "waiting", timeout=45, message="the call handed on")
    finally:
        sweeper.stop()
        sweeper.thread.join(timeout=30)
    assert not sweeper.thread.is_alive()
    assert task(run, "a").claim is None
    expired = TraceEvent.objects.get(run=run, event="claim_expired")
    # Not before its lease ran out: a holder has the whole lease to heartbeat.
    heard = expired.data["heartbeat_at"]
    assert (expired.at - datetime.fromisoformat(heard)).total_seconds() >= 1.0


@pytest.mark.spec("S10")
@pytest.mark.django_db
def test_the_claims_sweep_hands_on_the_longest_silent_holder_first() -> None:
    """Many holders stopping at once are handed on one transaction at a time; the one whose lease
    ran out first goes first, so the last handed on is the one whose lease ran out last."""
    now = timezone.now()
    lease = float(settings.OZ0_LEASE_SECONDS)
    runs = [claimed_call(Team()) for _ in range(4)]
    silent_for = [lease + 2, lease + 9, lease + 1, lease + 5]  # in the runs' creation order
    for run, seconds in zip(runs, silent_for, strict=True):
        Task.objects.filter(run=run).update(heartbeat_at=now - timedelta(seconds=seconds))
    with connection.cursor() as cursor:  # whatever plan the database picks: a table scan's order is the rows'
        cursor.execute("SET LOCAL enable_indexscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
        cursor.execute("SET LOCAL enable_indexonlyscan = off")
    assert kernel.sweep_expired_claims(now) == 4
    handed_on = [event.run_id for event in TraceEvent.objects.filter(event="claim_expired").order_by("id")]
    by_silence = [run.pk for _, run in sorted(zip(silent_for, runs, strict=True), key=lambda pair: -pair[0])]
    assert handed_on == by_silence


def test_claims_only_wakes_are_a_tenth_of_a_period_apart_however_many_leases_run_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Holders whose leases run out one after another (or a lease the sweep cannot act on, always
    due) never make the sweeper spin: between two passes the claims-only sweeps are spaced by a
    tenth of the period at least, and a lease due within that of the next pass is left to it."""
    from runs.worker import periodic

    swept: list[float] = []
    monkeypatch.setattr(periodic, "_expired_claims", lambda watch: swept.append(time.monotonic()) or 0)
    monkeypatch.setattr(periodic, "close_old_connections", lambda: None)  # no database in this test
    sweeper = Sweeper()
    sweeper.period = 1.0
    monkeypatch.setattr(sweeper, "_next_claim_expiry", time.monotonic)  # always a lease ending now
    started = time.monotonic()
    sweeper._claims_until(started + sweeper.period)
    assert 1 <= len(swept) <= 10
    assert all(later - earlier >= 0.1 for earlier, later in itertools.pairwise(swept))
