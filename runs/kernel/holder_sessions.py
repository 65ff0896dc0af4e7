"""A holder's database sessions, named after it, so the lease sweep can free what a frozen one holds.

A worker stopped (SIGSTOP, a paused VM, a host cut off) between two statements of one transaction
keeps that transaction's row locks: its run's, its tasks'. Its claims run out a lease later, but
the sweep that would hand them on needs those same locks, and PostgreSQL frees them only when the
session is ended, DB_IDLE_IN_TRANSACTION_SECONDS (30 s at least) after the last statement. With a
shorter lease the call waited that long instead of a lease; so did every click on the run.

So each worker process names its sessions after itself (`holder_session_name`, the `host:pid` its
claims carry), and the sweep, before handing on the claims of a worker past its lease, ends that
worker's sessions that sit idle inside a transaction. They belong to a process the lease has
already declared gone: whatever they would still write is refused anyway (the claim's report
records `lease_lost`). A session of a live worker, or one of the worker's busy in a statement, is
never touched.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.db import DatabaseError, connection, transaction

log = logging.getLogger(__name__)

HOLDER_SESSION_PREFIX = "oz0 worker "
# PostgreSQL keeps the first 63 bytes of an application_name (NAMEDATALEN - 1).
_NAME_BYTES = 63


def worker_of(claim: str) -> str:
    """The worker a claim names: `host:pid` (runs.worker.execution.new_claim)."""
    return ":".join(claim.split(":")[:2])


def holder_session_name(worker: str) -> str:
    """The application_name of a worker's database sessions: `worker` is its `host:pid`."""
    return f"{HOLDER_SESSION_PREFIX}{worker}".encode()[:_NAME_BYTES].decode(errors="ignore")


def end_frozen_holder_sessions(claims: Iterable[str | None], *, idle_seconds: float) -> int:
    """End the sessions of the workers holding `claims` (claims already past their lease) that
    have sat idle inside a transaction for at least `idle_seconds`, waiting for each to go so its
    locks are free when this returns. Returns how many were ended. A database that refuses
    (a role without the right to end them) leaves them to DB_IDLE_IN_TRANSACTION_SECONDS."""
    names = sorted({holder_session_name(worker_of(claim)) for claim in claims if claim})
    if not names:
        return 0
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                """
                SELECT pid, application_name, pg_terminate_backend(pid, 1000) FROM pg_stat_activity
                WHERE datname = current_database() AND pid <> pg_backend_pid()
                  AND application_name = ANY(%s)
                  AND state IN ('idle in transaction', 'idle in transaction (aborted)')
                  AND state_change < clock_timestamp() - make_interval(secs => %s)
                """,
                [names, float(idle_seconds)],
            )
            ended = cursor.fetchall()
    except DatabaseError:
        log.warning("could not end the sessions of workers past their lease", exc_info=True)
        return 0
    for pid, name, gone in ended:
        log.warning(
            "ended database session %s of %s: its worker is past its lease, idle inside a transaction%s",
            pid,
            name[len(HOLDER_SESSION_PREFIX) :],
            "" if gone else " (still going after 1 s)",
        )
    return len(ended)
