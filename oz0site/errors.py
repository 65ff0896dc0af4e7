"""What a request answers when oz0 cannot reach its database (down, restarting, or the request's
session ended by the server): 503 with Retry-After, saying so, never a server error. The JSON API's
views answer it through their exception handler (oz0site/api.py); everything else that fails so,
a console page or a middleware's query, through Django's server-error view (`handler500`), which
renders nothing that needs the database.

Which errors mean the database cannot be reached (`is_database_error`) is said here once, for
these answers and for the workers' retries (runs/worker/reporting.py) alike."""

from __future__ import annotations

import sys

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from psycopg.errors import IdleInTransactionSessionTimeout

# psycopg's connection failures, a server shutting down, a dropped socket, a deadlock or a
# serialization failure: each leaves nothing committed of the statement's transaction.
DATABASE_ERRORS: tuple[type[Exception], ...] = (OperationalError, InterfaceError)
# A session the server ended because it sat idle inside a transaction (DB_IDLE_IN_TRANSACTION_SECONDS:
# a database frozen for a while, then resumed, ends such sessions first thing): PostgreSQL files
# it under "invalid transaction state", which Django raises as an InternalError. Its transaction
# is rolled back like any other lost connection's.
SESSION_ENDED: tuple[type[Exception], ...] = (IdleInTransactionSessionTimeout,)

# A restart or a failover takes seconds; a shorter hint would only add to the load as it comes back.
RETRY_AFTER_SECONDS = 5
KEY = "database_unavailable"
DETAIL = "the database cannot be reached right now: try again shortly (a create sent again with its Idempotency-Key is made once)"
PAGE = (
    "<!doctype html><html lang=en><meta charset=utf-8><title>oz0: database unavailable</title>"
    "<h1>oz0 cannot reach its database right now</h1><p>Try again in a few seconds.</p></html>"
)


def is_database_error(error: BaseException) -> bool:
    return isinstance(error, (*DATABASE_ERRORS, *SESSION_ENDED)) or isinstance(error.__cause__, SESSION_ENDED)


def database_unavailable(request: HttpRequest) -> HttpResponse:
    if request.path.startswith("/api/"):
        response: HttpResponse = JsonResponse({"error": {"key": KEY, "detail": DETAIL}}, status=503)
    else:
        response = HttpResponse(PAGE, status=503)
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


def server_error(request: HttpRequest) -> HttpResponse:
    """Django calls this inside the `except` that caught the request's error, so it is at hand."""
    error = sys.exc_info()[1]
    if error is not None and is_database_error(error):
        return database_unavailable(request)
    return defaults.server_error(request)
