"""The worker's side of a database outage: connections replaced, claims and reports tried again.

A worker thread keeps its database connection between tasks. After the server restarts (or the
network drops it) that connection is dead, and Django only notices at the next request boundary,
which a worker thread never reaches mid-call. So every thread that talks to the database here
drops its connection on a database error and opens a new one on the next try.

What is tried again, with backoff, for up to `OZ0_DATABASE_RETRY_SECONDS`:
- a claim (`claim_task`, `claim_batch`): the message waits in its slot for the database rather
  than being acknowledged as failed; past the limit it goes back to the queue (`DatabaseUnavailable`,
  which the Celery adapters turn into a requeue);
- a report that settles a claim (a call's value or failure, a round's outcome). Each is a
  compare-and-set on the claim, so a repeat is harmless: if the first try committed but its answer
  was lost, the repeat finds the claim gone and changes nothing. A report that could not be
  written is never turned into the call's failure: the claim stays for the lease sweep.

Only settling reports are repeated. A call a harnessed round authors mid-session (`round_call`)
keeps its claim, so a repeat after a lost answer would author the call twice: it is not wrapped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar

from django.conf import settings
from django.db import connection

from oz0site.errors import is_database_error

log = logging.getLogger(__name__)

T = TypeVar("T")

FIRST_DELAY = 0.1
MAX_DELAY = 5.0


class DatabaseUnavailable(Exception):
    """The database stayed unreachable for as long as the worker tries (OZ0_DATABASE_RETRY_SECONDS)."""


def replace_connection() -> None:
    """Drop this thread's database connection after a failure: the next query opens a new one."""
    try:
        connection.close()
    except Exception:  # closing a connection the server already dropped may complain; it is gone either way
        pass


def delays(seconds: float) -> Iterator[float]:
    """The pauses between tries: doubling from FIRST_DELAY up to MAX_DELAY, for `seconds` in all."""
    deadline = time.monotonic() + seconds
    delay = FIRST_DELAY
    while time.monotonic() + delay <= deadline:
        yield delay
        delay = min(delay * 2, MAX_DELAY)


def with_database(
    attempt: Callable[[], T],
    what: str,
    *,
    seconds: float | None = None,
    holding: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> T:
    """`attempt()`, tried again after a database error (the connection replaced first) until it
    answers or `seconds` (OZ0_DATABASE_RETRY_SECONDS) pass: then DatabaseUnavailable.

    `holding` wraps each try but not the pause between tries (a heartbeat thread's lock, say, so
    the claim keeps being proven alive while the worker waits). Inside a transaction of the
    caller's own nothing is repeated: its error is the caller's."""
    pauses = delays(float(settings.OZ0_DATABASE_RETRY_SECONDS) if seconds is None else seconds)
    tries = 0
    while True:
        try:
            with holding():
                return attempt()
        except Exception as error:
            if not is_database_error(error) or connection.in_atomic_block:
                raise
            replace_connection()
            tries += 1
            pause = next(pauses, None)
            if pause is None:
                log.error("%s: the database stayed unreachable after %d tries: %s", what, tries, error)
                raise DatabaseUnavailable(f"{what}: {error}") from error
            if tries == 1 or tries % 10 == 0:
                log.warning("%s: the database is unreachable (%s); trying again", what, str(error).strip())
            time.sleep(pause)


def settle(report: Callable[..., bool], *args: Any, **kwargs: Any) -> bool:
    """A kernel report that settles a claim (`task_complete`, `task_fail`, `round_expand`, ...),
    tried again through a database outage. False when the claim was lost."""
    claimed = args[0] if args else kwargs.get("claimed")
    what = f"{report.__name__} of task {getattr(claimed, 'task_id', '?')}"
    return with_database(lambda: report(*args, **kwargs), what)
