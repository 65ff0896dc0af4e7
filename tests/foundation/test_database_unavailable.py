"""A request that cannot reach the database (down, restarting, or its session ended by the server,
as the idle-in-transaction bound ends a frozen one) answers 503 with Retry-After, saying so: a
typed body on the JSON API, a page of its own (rendered without the database) in the console.
Any other database error stays a server error. Each session here is really ended by the server."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, InterfaceError, connection
from django.test import Client

from tests.conftest import Team, own_session


def end_this_session() -> None:
    """The server ends the session Django's connection holds, as an administrator or a restart would."""
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    with own_session(autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


def api_read_when_the_token_lookup_raises(error: Exception, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A viewer's read of the JSON API whose first query, the token's lookup, raises `error`."""
    team = Team()

    def raising(*args: Any, **kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr("oz0site.auth.token_user_and", raising)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {team.tokens['viewer']}", raise_request_exception=False)
    return client.get(f"/api/v1/workspaces/{team.slug}/runs")


@pytest.mark.django_db(transaction=True)
def test_an_api_request_whose_database_session_is_gone_answers_a_typed_503_and_the_next_is_served(
    settings: Any,
) -> None:
    settings.DEBUG = False
    team = Team()
    client = Client(HTTP_AUTHORIZATION=f"Bearer {team.tokens['viewer']}", raise_request_exception=False)
    path = f"/api/v1/workspaces/{team.slug}/runs"
    end_this_session()
    response = client.get(path)
    assert response.status_code == 503, response.content
    assert response["Retry-After"] == "5"
    error = response.json()["error"]
    assert error["key"] == "database_unavailable" and "try again" in error["detail"]
    connection.close()  # what Django's request_finished does with an unusable connection (the test client skips it)
    response = client.get(path)
    assert response.status_code == 200, response.content


@pytest.mark.django_db(transaction=True)
def test_a_console_page_whose_database_session_is_gone_answers_503_and_names_it(settings: Any) -> None:
    settings.DEBUG = False
    team = Team()
    client = Client(raise_request_exception=False)
    client.force_login(team.users["viewer"])
    end_this_session()
    response = client.get("/")  # the signed-in person is looked up first: a middleware's query
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert b"cannot reach its database" in response.content
    connection.close()
    assert client.get("/").status_code in (200, 302)


@pytest.mark.django_db
def test_any_other_database_error_stays_a_server_error(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken constraint is oz0's own fault, not an outage: no Retry-After invites it again."""
    settings.DEBUG = False
    response = api_read_when_the_token_lookup_raises(
        IntegrityError("duplicate key value violates unique constraint"), monkeypatch
    )
    assert response.status_code == 500
    assert "Retry-After" not in response
    assert b"database_unavailable" not in response.content


@pytest.mark.django_db
def test_a_connection_already_closed_is_unavailable_too(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Django raises InterfaceError, which is not a DatabaseError, for a connection closed under it.
    The API's own handler answers it, with DEBUG on too (where ninja would answer a traceback)."""
    settings.DEBUG = True
    response = api_read_when_the_token_lookup_raises(InterfaceError("connection already closed"), monkeypatch)
    assert response.status_code == 503 and response["Retry-After"] == "5"
    assert response.json()["error"]["key"] == "database_unavailable"
