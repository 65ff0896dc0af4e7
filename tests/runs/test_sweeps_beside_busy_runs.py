"""One sweeper serves every workspace: a run whose row lock another transaction holds for longer
than half the sweeper's period (a neighbour's large append, a holder gone quiet) is passed over for
this pass, and the next pass comes back to it. Before, the sweeper queued behind that lock for as
long as it was held, and every other workspace's expired claims and clocks waited with it. A short
holder is waited out: on a busy run the sweep still gets its turn."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection, connections
from django.utils import timezone

from runs import kernel
from runs.kernel import sweep_clocks, sweep_expired_claims
from runs.models import Run, Task
from tests.conftest import Team, own_session, wait_for
from tests.runs.driver import echo, task


def claimed_call(team: Team) -> Run:
    run, _ = kernel.create_run(workspace=team.workspace, user=team.users["operator"], body={"tasks": [echo("a")]})
    assert kernel.claim_task(run.pk, task(run, "a").pk, f"host-{team.slug}:4242:abc") is not None
    return run


@pytest.fixture
def lock_holder() -> Iterator[psycopg.Connection[Any]]:
    """Another session, as a neighbour's long transaction would be: it holds what it locks until
    it rolls back."""
    holder = own_session("")  # no idle bound: it holds as long as the test wants
    try:
        yield holder
    finally:
        holder.close()


def sweep_beside(sweep: Callable[[], int]) -> int:
    """The sweep, in a thread of its own: if it waited on the held lock, the test would hang."""
    done: list[int] = []

    def run() -> None:
        try:
            done.append(sweep())
        finally:
            connections.close_all()

    sweeper = threading.Thread(target=run, name="sweeper")
    sweeper.start()
    sweeper.join(timeout=60)  # a liveness bound, not a speed target
    assert not sweeper.is_alive(), "the sweep waits on the neighbour's lock"
    return done[0]


def waiting_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()")
        return bool(cursor.fetchone()[0])


def later(seconds: float) -> datetime:
    return timezone.now() + timedelta(seconds=seconds)


@pytest.mark.spec("S10")
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_the_claims_sweep_passes_over_a_locked_run_and_comes_back_to_it(lock_holder: psycopg.Connection[Any]) -> None:
    neighbour, quiet = claimed_call(Team()), claimed_call(Team())
    lock_holder.execute("SELECT id FROM runs_run WHERE id = %s FOR UPDATE", [neighbour.pk])
    past_the_lease = later(settings.OZ0_LEASE_SECONDS + 1)

    assert sweep_beside(lambda: sweep_expired_claims(past_the_lease)) == 1
    assert (task(quiet, "a").status, task(quiet, "a").claim) == ("waiting", None)  # replayable: handed on
    assert task(neighbour, "a").status == "running"  # untouched while its run is another's

    lock_holder.rollback()
    assert sweep_beside(lambda: sweep_expired_claims(past_the_lease)) == 1
    assert (task(neighbour, "a").status, task(neighbour, "a").claim) == ("waiting", None)
    assert sweep_beside(lambda: sweep_expired_claims(past_the_lease)) == 0  # nothing twice


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_the_clocks_sweep_passes_over_a_locked_run_and_comes_back_to_it(lock_holder: psycopg.Connection[Any]) -> None:
    neighbour, quiet = claimed_call(Team()), claimed_call(Team())
    Task.objects.filter(run__in=[neighbour, quiet], key="a").update(deadline_at=timezone.now() - timedelta(seconds=1))
    lock_holder.execute("SELECT id FROM runs_run WHERE id = %s FOR UPDATE", [neighbour.pk])

    assert sweep_beside(lambda: sweep_clocks(later(1))) == 1
    assert (task(quiet, "a").status, task(quiet, "a").error_key) == ("timed_out", "tool_timeout")
    assert task(neighbour, "a").status == "running"

    lock_holder.rollback()
    assert sweep_beside(lambda: sweep_clocks(later(1))) == 1
    assert (task(neighbour, "a").status, task(neighbour, "a").error_key) == ("timed_out", "tool_timeout")


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_a_short_holder_is_waited_out(lock_holder: psycopg.Connection[Any], settings: Any) -> None:
    settings.OZ0_SWEEP_SECONDS = 60.0  # the sweep would wait 30 s: the holder lets go long before
    busy = claimed_call(Team())
    lock_holder.execute("SELECT id FROM runs_run WHERE id = %s FOR UPDATE", [busy.pk])
    swept: list[int] = []
    sweeper = threading.Thread(
        target=lambda: (swept.append(sweep_expired_claims(later(settings.OZ0_LEASE_SECONDS + 1))), connections.close_all())
    )
    sweeper.start()
    wait_for(waiting_on_a_lock, timeout=30, message="the sweep waiting on the run's lock")
    lock_holder.rollback()  # the holder's transaction ends
    sweeper.join(timeout=60)
    assert not sweeper.is_alive() and swept == [1]
    assert (task(busy, "a").status, task(busy, "a").claim) == ("waiting", None)
