"""Celery workers keep their database session across tasks, and still drop an old or broken one.

Celery's Django fixup closes every connection before and after each task unless
CELERY_DB_REUSE_MAX is set; oz0 sets it and closes old connections around tasks itself
(oz0site.celery.close_obsolete_connections), as Django does around requests.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from celery.fixups.django import DjangoWorkerFixup
from django.conf import settings
from django.db import connection

from oz0site.celery import app, close_obsolete_connections


def a_task(*, eager: bool) -> SimpleNamespace:
    return SimpleNamespace(request=SimpleNamespace(is_eager=eager))


def open_session() -> object:
    connection.ensure_connection()
    return connection.connection


@pytest.mark.django_db(transaction=True)
def test_the_fixup_no_longer_closes_the_session_around_each_task() -> None:
    fixup = DjangoWorkerFixup(app)
    assert fixup.db_reuse_max == settings.CELERY_DB_REUSE_MAX >= 100
    session = open_session()
    connection.close_at = time.monotonic() + 300  # within DB_CONN_MAX_AGE, whatever the test settings say
    for _ in range(10):
        fixup.on_task_prerun(a_task(eager=False))
        close_obsolete_connections(a_task(eager=False))
        connection.cursor().execute("SELECT 1")
        close_obsolete_connections(a_task(eager=False))
        fixup.on_task_postrun(a_task(eager=False))
    assert connection.connection is session


@pytest.mark.django_db(transaction=True)
def test_a_session_past_its_age_or_broken_is_closed_before_the_next_task() -> None:
    open_session()
    connection.close_at = time.monotonic() - 1  # past DB_CONN_MAX_AGE
    close_obsolete_connections(a_task(eager=False))
    assert connection.connection is None
    open_session()
    connection.close_at = None
    connection.errors_occurred = True
    connection.connection.close()  # the server went away under it
    close_obsolete_connections(a_task(eager=False))
    assert connection.connection is None


@pytest.mark.django_db(transaction=True)
def test_an_eager_task_leaves_its_callers_connection_alone() -> None:
    session = open_session()
    connection.close_at = time.monotonic() - 1
    close_obsolete_connections(a_task(eager=True))
    assert connection.connection is session
