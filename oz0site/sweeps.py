"""What every beat-sent sweep of the apps above `runs` shares: a database that is away skips one
pass (a warning), never a task "raised unexpected" in the worker's log. Beat sends the next pass
on its own clock, so nothing is lost by skipping; the worker's connection is replaced."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from oz0site.errors import is_database_error
from runs.worker.reporting import replace_connection

log = logging.getLogger(__name__)


@contextmanager
def skipped_while_the_database_is_away(what: str) -> Iterator[None]:
    try:
        yield
    except Exception as error:
        if not is_database_error(error):
            raise
        replace_connection()
        log.warning("%s skipped: the database is unreachable (%s); the next pass tries again", what, str(error).splitlines()[0])
