"""A process cut off from the network (or frozen) inside a transaction does not hold its run's row
lock for long: PostgreSQL ends every oz0 session that sits idle inside a transaction for
DB_IDLE_IN_TRANSACTION_SECONDS (a lease, at least 30 s, by default), so the claims sweep, and whatever waits
behind it, goes on. Without it the lock lasted until TCP gave up on the dead peer: on four hosts a
worker cut off mid-transaction stopped the sweeper for longer than the faults test waited. (The
sweeper itself now passes a locked run over, tests/runs/test_sweeps_beside_busy_runs.py; the run
still needs its lock back to be swept.)"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import psycopg
import psycopg.errors
import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.commands.migrate import Command as DjangoMigrate
from django.db import connection
from django.utils import timezone

from oz0site.config import idle_in_transaction_option
from runs import kernel
from runs.kernel import sweep_expired_claims
from runs.models import TraceEvent
from tests.conftest import Team, own_session, wait_for
from tests.runs.driver import task

QUIET_SECONDS = 1.0


def backend_alive(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
        return bool(cursor.fetchone()[0])


def server_setting(cursor: Any, name: str) -> str:
    cursor.execute("SELECT setting FROM pg_settings WHERE name = %s", [name])
    return str(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_the_processes_sessions_carry_the_bound() -> None:
    assert max(settings.OZ0_LEASE_SECONDS, 30.0) == settings.DB_IDLE_IN_TRANSACTION_SECONDS  # the default
    with connection.cursor() as cursor:
        bound = int(server_setting(cursor, "idle_in_transaction_session_timeout"))
    assert bound == round(settings.DB_IDLE_IN_TRANSACTION_SECONDS * 1000) > 0


def test_the_bound_joins_what_the_database_url_gave() -> None:
    assert idle_in_transaction_option(30) == "-c idle_in_transaction_session_timeout=30000"
    given = "-c search_path=public"
    assert idle_in_transaction_option(0.25, given) == f"{given} -c idle_in_transaction_session_timeout=250"


def a_session_like_the_processes(quiet_seconds: float) -> psycopg.Connection[Any]:
    """A connection made as the processes make theirs, with a shorter bound (theirs is a lease, at least 30 s)."""
    return own_session(idle_in_transaction_option(quiet_seconds))


@pytest.mark.spec("S10")
@pytest.mark.django_db(transaction=True)
def test_a_holder_gone_quiet_inside_a_transaction_loses_its_lock_and_its_call_is_swept() -> None:
    team = Team()
    spec = {"key": "pay", "kind": "tool", "tool": "test.effect", "args": {"id": uuid.uuid4().hex}}
    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={"tasks": [spec], "approval": {"mode": "bypass"}},
    )
    assert kernel.claim_task(run.pk, task(run, "pay").pk, "host-b:4242:cut") is not None
    # The holder's worker took the run's row lock for its report and then heard nothing more:
    # its host was cut off between two statements of one transaction.
    holder = a_session_like_the_processes(QUIET_SECONDS)
    holder.execute("SELECT id FROM runs_run WHERE id = %s FOR UPDATE", [run.pk])

    # The server ends the quiet session once the bound has passed: its backend goes away.
    wait_for(lambda: not backend_alive(holder.info.backend_pid), timeout=30, message="the quiet holder's session ended")
    assert sweep_expired_claims(timezone.now() + timedelta(seconds=settings.OZ0_LEASE_SECONDS + 1)) == 1
    pay = task(run, "pay")
    assert (pay.status, pay.error_key, pay.claim) == ("uncertain", "tool_uncertain", None)
    assert TraceEvent.objects.filter(run=run, task_key="pay", event="claim_expired").count() == 1
    # The server ended the holder's session: what it would have written next is refused, not applied.
    with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
        holder.execute("UPDATE runs_run SET status = 'completed' WHERE id = %s", [run.pk])
    holder.close()
    run.refresh_from_db()
    assert run.status != "completed"


@pytest.mark.django_db
def test_a_migration_runs_without_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Between the statements of a migration's transaction runs its own Python, for as long as it
    needs: on a loaded machine the server ended a migration at a short lease's bound."""
    seen: list[str] = []

    def django_migrate(self: Any, *args: Any, **options: Any) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SHOW idle_in_transaction_session_timeout")
            seen.append(str(cursor.fetchone()[0]))

    monkeypatch.setattr(DjangoMigrate, "handle", django_migrate)
    call_command("migrate", verbosity=0)
    assert seen == ["0"]
    with connection.cursor() as cursor:  # and the connection's own bound once it is done
        assert int(server_setting(cursor, "idle_in_transaction_session_timeout")) == round(
            settings.DB_IDLE_IN_TRANSACTION_SECONDS * 1000
        )
