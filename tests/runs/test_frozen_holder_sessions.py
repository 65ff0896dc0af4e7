"""A worker frozen inside a transaction (SIGSTOP, a paused VM) kept its run's row lock until
PostgreSQL's idle bound ended its session (DB_IDLE_IN_TRANSACTION_SECONDS, 30 s at least): with a
shorter lease its call was handed on that late, not a lease after its last heartbeat, as the
chaos run's "a worker stopped past its lease" saw (9.2 s against a bound of 6). Worker processes
now name their sessions after the `host:pid` their claims carry, and the claims sweep ends the
sessions of a worker past its lease that sit idle inside a transaction
(runs/kernel/holder_sessions.py). Nobody else's session is touched."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection, connections
from django.db.backends.signals import connection_created
from django.utils import timezone

from runs import kernel
from runs.kernel import end_frozen_holder_sessions, holder_session_name, sweep_expired_claims
from runs.models import Run, TraceEvent
from runs.worker.execution import name_database_session, new_claim, worker_identity
from tests.conftest import Team, own_session, wait_for
from tests.runs.driver import echo, task
from tests.runs.test_idle_transactions import backend_alive
from tests.runs.test_sweeps_beside_busy_runs import sweep_beside

FROZEN = "host-frozen:4242"
LIVE = "host-live:777"


def claimed_by(worker: str) -> Run:
    run, _ = kernel.create_run(workspace=Team().workspace, user=None, body={"tasks": [echo("a")]})
    assert kernel.claim_task(run.pk, task(run, "a").pk, f"{worker}:abc") is not None
    return run


@pytest.fixture
def sessions() -> Iterator[list[psycopg.Connection[Any]]]:
    opened: list[psycopg.Connection[Any]] = []
    yield opened
    for session in opened:
        session.close()


def session_of(worker: str, opened: list[psycopg.Connection[Any]]) -> psycopg.Connection[Any]:
    """A session named as `worker`'s processes name theirs, with no idle bound of its own."""
    session = own_session("")
    session.execute("SELECT set_config('application_name', %s, false)", [holder_session_name(worker)])
    session.commit()
    opened.append(session)
    return session


def idle_in_transaction(session: psycopg.Connection[Any], *, longer_than: float) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT state = 'idle in transaction' AND state_change < clock_timestamp() - make_interval(secs => %s) "
            "FROM pg_stat_activity WHERE pid = %s",
            [longer_than, session.info.backend_pid],
        )
        row = cursor.fetchone()
    return bool(row and row[0])


def holding_the_lock_of(
    run: Run, worker: str, opened: list[psycopg.Connection[Any]], *, idle_for: float | None = None
) -> psycopg.Connection[Any]:
    """A session of `worker`'s that took `run`'s row lock and then went quiet inside its
    transaction; with `idle_for`, once it has been quiet that long."""
    session = session_of(worker, opened)
    session.execute("SELECT id FROM runs_run WHERE id = %s FOR UPDATE", [run.pk])
    if idle_for is not None:
        wait_for(
            lambda: idle_in_transaction(session, longer_than=idle_for), message=f"{worker}'s session idle in its transaction"
        )
    return session


def past_the_lease() -> Any:
    return timezone.now() + timedelta(seconds=settings.OZ0_LEASE_SECONDS + 1)


@pytest.mark.spec("S10")
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_a_worker_frozen_holding_its_runs_lock_is_ended_and_its_call_handed_on(
    sessions: list[psycopg.Connection[Any]], settings: Any
) -> None:
    settings.OZ0_HEARTBEAT_SECONDS = 0.05
    run = claimed_by(FROZEN)
    # Its worker took the run's row lock for a report and then stopped between two statements.
    frozen = holding_the_lock_of(run, FROZEN, sessions, idle_for=0.05)

    assert sweep_beside(lambda: sweep_expired_claims(past_the_lease())) == 1
    a = task(run, "a")
    assert (a.status, a.claim) == ("waiting", None)  # replayable: handed on a lease after, not 30 s
    expired = TraceEvent.objects.get(run=run, task_key="a", event="claim_expired")
    assert expired.data["claim"] == f"{FROZEN}:abc"
    assert not backend_alive(frozen.info.backend_pid)
    # What the frozen worker would have written on waking is refused, never applied.
    with pytest.raises(psycopg.OperationalError):
        frozen.execute("UPDATE runs_run SET status = 'completed' WHERE id = %s", [run.pk])
    run.refresh_from_db()
    assert run.status != "completed"


@pytest.mark.spec("S10")
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_sessions_of_live_workers_and_of_a_holder_still_inside_a_heartbeat_are_left_alone(
    sessions: list[psycopg.Connection[Any]], settings: Any
) -> None:
    settings.OZ0_HEARTBEAT_SECONDS = 0.05
    # A live worker's long transaction holds the lock of a run whose call's holder is past its lease.
    held_by_a_live_worker = claimed_by(FROZEN)
    live = holding_the_lock_of(held_by_a_live_worker, LIVE, sessions, idle_for=0.05)
    # The frozen worker's other session, outside any transaction, holds nothing.
    resting = session_of(FROZEN, sessions)

    assert sweep_beside(lambda: sweep_expired_claims(past_the_lease())) == 0  # passed over, as before
    assert task(held_by_a_live_worker, "a").status == "running"
    assert backend_alive(live.info.backend_pid) and backend_alive(resting.info.backend_pid)
    live.rollback()
    assert sweep_beside(lambda: sweep_expired_claims(past_the_lease())) == 1

    # A holder's session idle inside a transaction for less than a heartbeat may be a live
    # worker between two statements: it is left to the next pass.
    settings.OZ0_HEARTBEAT_SECONDS = 3600
    run = claimed_by(FROZEN)
    frozen = holding_the_lock_of(run, FROZEN, sessions)
    assert sweep_beside(lambda: sweep_expired_claims(past_the_lease())) == 0
    assert task(run, "a").status == "running"
    assert backend_alive(frozen.info.backend_pid)


@pytest.mark.django_db(transaction=True)
def test_ending_sessions_takes_claims_and_names_only(sessions: list[psycopg.Connection[Any]]) -> None:
    # Claims without a worker's name (a runner's lease) or none at all end nothing.
    bystander = session_of(LIVE, sessions)
    bystander.execute("SELECT 1")
    assert end_frozen_holder_sessions([None, "", "oz0x:runner-7:abc"], idle_seconds=0) == 0
    assert backend_alive(bystander.info.backend_pid)
    # A crafted name cannot reach past ANY(): it is a parameter, compared whole.
    assert end_frozen_holder_sessions(["x' OR 1=1 --:1:abc"], idle_seconds=0) == 0
    assert backend_alive(bystander.info.backend_pid)


@pytest.mark.django_db(transaction=True)
def test_a_worker_process_names_its_sessions_as_its_claims_name_it() -> None:
    assert new_claim().startswith(f"{worker_identity()}:") and worker_identity().count(":") == 1
    # PostgreSQL keeps 63 bytes of a name: a long host still fits whole in what is compared.
    assert len(holder_session_name("h" * 24 + ":4194304").encode()) <= 63
    connection_created.connect(name_database_session, dispatch_uid="test-name-the-database-sessions")
    fresh = connections.create_connection("default")
    try:
        fresh.ensure_connection()
        with fresh.cursor() as cursor:
            cursor.execute("SELECT current_setting('application_name')")
            assert cursor.fetchone()[0] == holder_session_name(worker_identity())
        # Named already (a pooled connection taken again): no second statement.
        statements: list[str] = []
        with fresh.execute_wrapper(lambda execute, sql, *rest: statements.append(sql) or execute(sql, *rest)):
            name_database_session(connection=fresh)
        assert statements == []
    finally:
        connection_created.disconnect(dispatch_uid="test-name-the-database-sessions")
        fresh.close()
