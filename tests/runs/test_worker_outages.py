"""The worker's side of faults, in-process: reports tried again through a database error, the
claim check making a repeat harmless, a refused late report recorded (`lease_lost`), and the
claims sweep giving holders the time the database was away."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import InternalError as DjangoInternalError
from django.db import OperationalError, connection, transaction
from django.utils import timezone
from psycopg.errors import IdleInTransactionSessionTimeout

from runs import kernel
from runs.kernel import sweep_expired_claims
from runs.models import TraceEvent
from runs.worker import reporting
from tests.conftest import Team, own_session, wait_for
from tests.runs.driver import echo, task


def claimed_call(team: Team, claim: str = "host-a:4242:abc") -> tuple[Any, kernel.Claimed]:
    run, _ = kernel.create_run(workspace=team.workspace, user=team.users["operator"], body={"tasks": [echo("a")]})
    claimed = kernel.claim_task(run.pk, task(run, "a").pk, claim)
    assert claimed is not None
    return run, claimed


def test_a_report_is_tried_again_after_a_database_error(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    monkeypatch.setattr(reporting, "FIRST_DELAY", 0.001)
    monkeypatch.setattr(reporting.time, "sleep", lambda seconds: None)
    tries: list[int] = []

    def flaky() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise OperationalError("terminating connection due to unexpected postmaster exit")
        return "written"

    assert reporting.with_database(flaky, "a report", seconds=5) == "written"
    assert len(tries) == 3


def a_session_the_server_ended() -> BaseException:
    """What a worker's next statement raises after PostgreSQL ended its session for sitting idle
    inside a transaction (DB_IDLE_IN_TRANSACTION_SECONDS): taken from a real session."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL idle_in_transaction_session_timeout = 50")
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
            with own_session(autocommit=True) as watcher:

                def ended() -> bool:
                    return not watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()[0]

                wait_for(ended, timeout=30, message="the server ending the idle session")
            cursor.execute("SELECT 1")
    except Exception as error:
        return error
    raise AssertionError("the server did not end the session")


@pytest.mark.django_db(transaction=True)
def test_a_session_the_server_ended_idle_in_a_transaction_is_a_database_error_not_the_calls_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ended = a_session_the_server_ended()
    # Most often the server's own word comes first: an InternalError, which needs naming. On a loaded
    # machine the client may find the socket closed before it reads that word (CI once saw
    # "server closed the connection unexpectedly"): an OperationalError. Either is a database error.
    assert isinstance(ended, DjangoInternalError | OperationalError), ended
    assert reporting.is_database_error(ended)
    named = DjangoInternalError("terminating connection due to idle-in-transaction timeout")
    named.__cause__ = IdleInTransactionSessionTimeout("terminating connection due to idle-in-transaction timeout")
    assert reporting.is_database_error(named)
    assert not reporting.is_database_error(DjangoInternalError("current transaction is aborted"))
    reporting.replace_connection()
    # A report that met it is tried again on a new connection, not turned into the call's failure.
    monkeypatch.setattr(reporting.time, "sleep", lambda seconds: None)
    tries: list[int] = []

    def report() -> str:
        tries.append(1)
        if len(tries) == 1:
            raise ended
        with connection.cursor() as cursor:
            cursor.execute("SELECT 'written'")
            return str(cursor.fetchone()[0])

    assert reporting.with_database(report, "a report", seconds=5) == "written"
    assert len(tries) == 2


def test_a_database_that_stays_away_is_told_apart_from_the_calls_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reporting.time, "sleep", lambda seconds: None)

    def away() -> None:
        raise OperationalError("connection refused")

    with pytest.raises(reporting.DatabaseUnavailable):
        reporting.with_database(away, "a report", seconds=0.5)


@pytest.mark.django_db
def test_inside_the_callers_transaction_nothing_is_repeated() -> None:
    tries: list[int] = []

    def fails() -> None:
        tries.append(1)
        raise OperationalError("deadlock detected")

    with transaction.atomic(), pytest.raises(OperationalError):
        reporting.with_database(fails, "a report", seconds=5)
    assert tries == [1]


def test_a_repeated_report_changes_nothing(team: Team) -> None:
    """The first try committed but its answer was lost: the repeat finds the claim gone."""
    run, claimed = claimed_call(team)
    assert kernel.task_complete(claimed, "v") is True
    assert kernel.task_complete(claimed, "v") is False
    assert task(run, "a").status == "completed"
    assert not TraceEvent.objects.filter(run=run, event="lease_lost").exists()  # not a lost lease


@pytest.mark.spec("S10")
def test_a_report_after_the_lease_sweep_took_the_claim_is_recorded(team: Team, caplog: pytest.LogCaptureFixture) -> None:
    run, claimed = claimed_call(team)
    sweep_expired_claims(timezone.now() + timedelta(seconds=settings.OZ0_LEASE_SECONDS + 1))
    expired = TraceEvent.objects.get(run=run, event="claim_expired")
    assert expired.data["claim"] == claimed.claim and expired.data["heartbeat_at"]
    assert kernel.task_complete(claimed, "late") is False
    lost = TraceEvent.objects.get(run=run, event="lease_lost")
    assert lost.task_key == "a" and lost.data == {"worker": "host-a:4242", "claim": claimed.claim, "attempt": 1}
    assert "worker host-a:4242 reported task" in caplog.text


def test_a_report_refused_for_a_cancel_is_no_lost_lease(team: Team) -> None:
    run, claimed = claimed_call(team)
    kernel.cancel_run(run_id=run.pk, user=team.users["operator"], reason="stop")
    kernel.task_stopped(claimed)
    kernel.task_complete(claimed, "late")
    assert not TraceEvent.objects.filter(run=run, event="lease_lost").exists()


def test_the_claims_sweep_gives_holders_the_grace_it_is_given(team: Team) -> None:
    run, _ = claimed_call(team)
    later = timezone.now() + timedelta(seconds=settings.OZ0_LEASE_SECONDS + 1)
    assert sweep_expired_claims(later, grace=10) == 0
    assert task(run, "a").status == "running"
    assert sweep_expired_claims(later + timedelta(seconds=10)) == 1
