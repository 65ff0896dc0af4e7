"""The suite's own hygiene: a test database is dropped at the end with no session left on it."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections

from tests.conftest import close_other_threads_connections, wait_for

pytestmark = pytest.mark.usefixtures("committed")


def _backends_of_this_database() -> set[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
        return {pid for (pid,) in cursor.fetchall()}


def test_a_connection_left_open_by_a_thread_that_ended_is_closed_before_the_drop() -> None:
    """Before, a connection left open by a thread that had ended held the test database, and
    pytest-django could not drop it ("accessed by other users")."""
    before = _backends_of_this_database()
    opened: list[int] = []

    def query_then_end() -> None:
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            opened.append(cursor.fetchone()[0])
        # no close: the thread ends with its connection open, as a request's thread does

    thread = threading.Thread(target=query_then_end)
    thread.start()
    thread.join()
    assert opened and opened[0] in _backends_of_this_database() - before

    assert close_other_threads_connections() >= 1

    # The server ends the backend once its client has hung up.
    wait_for(lambda: opened[0] not in _backends_of_this_database(), timeout=10, message="the backend to end")
