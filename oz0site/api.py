"""The JSON API (API.md): one NinjaAPI, bearer tokens or the console's session, typed errors."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextvars import ContextVar
from functools import wraps
from typing import Any

from django.apps import apps as django_apps
from django.db import Error
from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser

from evals.api import router as evals_router
from inbox.api import router as inbox_router
from inbox.approvals_api import router as approvals_router
from insights.api import router as insights_router
from insights.catalog import openapi_failures
from notify.api import router as notify_router
from oz0agents.api import router as agents_router
from oz0site import errors
from oz0site.auth import person_auth
from runs.api import router as runs_router
from runs.approver_groups_api import router as approvers_router
from runs.audit_api import router as audit_router
from runs.executor_api.router import router as executors_router
from runs.holds_api import router as holds_router
from runs.kernel import KernelError
from runs.schemas import read_body
from runs.walls_api import router as walls_router
from schedules.api import router as schedules_router
from tenancy.tokens import token_user

# Who asked for the OpenAPI document: its `x-oz0-failures` lists the agents of their workspaces.
_openapi_caller: ContextVar[Any] = ContextVar("oz0_openapi_caller", default=None)


def _caller(request: HttpRequest) -> Any:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token_user(token.strip())
    user = getattr(request, "user", None)
    return user if user is not None and user.is_authenticated else None


def with_caller(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        remembered = _openapi_caller.set(_caller(request))
        try:
            return view(request, *args, **kwargs)
        finally:
            _openapi_caller.reset(remembered)

    return wrapper


class Oz0Api(NinjaAPI):
    """The OpenAPI document carries the failure kinds of the caller's agents, read at request time (F13).

    The rest of it is the code's routes and schemas, the same for every caller until the process
    restarts: built once per process and shared. Built per request it took about half a second
    of the web process's CPU, and anyone may ask for it without signing in."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._built: dict[tuple[str | None, str], dict[str, Any]] = {}
        self._building = threading.Lock()

    def get_openapi_schema(self, *, path_prefix: str | None = None, path_params: dict[str, Any] | None = None) -> Any:
        key = (path_prefix, repr(sorted((path_params or {}).items())))
        with self._building:
            if key not in self._built:
                self._built[key] = super().get_openapi_schema(path_prefix=path_prefix, path_params=path_params)
            shared = self._built[key]
        kinds = openapi_failures(_openapi_caller.get())
        # Only these two keys differ per caller: the shared document itself is never changed.
        return {**shared, "info": {**shared["info"], "x-oz0-failures": kinds}, "x-oz0-failures": kinds}


class StrictJsonParser(Parser):
    """Parses bodies the way the row store needs: NUL bytes, exponent numbers and oversized
    payloads are refused typed (S30, S31) before any handler runs. It runs after the route's auth
    (`oz0site.auth.person_auth`), which checked the caller's standing and set the body's cap."""

    def parse_body(self, request: HttpRequest) -> Any:
        body = read_body(request)
        request._oz0_body = body  # type: ignore[attr-defined]
        return body


api = Oz0Api(
    title="oz0",
    parser=StrictJsonParser(),
    version="1",
    description="oz0's run engine: create runs, read their trace, and repair them.",
    urls_namespace="api",
    auth=person_auth(),
    openapi_extra={"info": {"x-oz0-failures": {}}},
    # The interactive docs load Swagger UI from the files django-ninja ships (the `ninja` app's
    # static files), never from a CDN.
    docs_decorator=with_caller,
)


def error_response(request: HttpRequest, key: str, detail: str, status: int, **extra: Any) -> HttpResponse:
    return api.create_response(request, {"error": {**extra, "key": key, "detail": detail}}, status=status)


@api.exception_handler(KernelError)
def kernel_error(request: HttpRequest, error: KernelError) -> HttpResponse:
    response = error_response(request, error.key, error.detail, error.status, **getattr(error, "extra", {}))
    retry_after = getattr(error, "retry_after", None)
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


# Error, not DatabaseError: a connection already closed raises InterfaceError, which is not one.
@api.exception_handler(Error)
def database_unavailable(request: HttpRequest, error: Error) -> HttpResponse:
    """The database unreachable, restarting, or this request's session ended by the server: the
    typed 503 of oz0site/errors.py. What the request had committed before stays committed; its
    open transaction is rolled back. Any other database error is oz0's own fault: a 500."""
    if not errors.is_database_error(error):
        raise error
    return errors.database_unavailable(request)


@api.exception_handler(AuthenticationError)
def unauthenticated(request: HttpRequest, error: AuthenticationError) -> HttpResponse:
    return error_response(request, "unauthenticated", "sign in, or send Authorization: Bearer <token>", 401)


@api.exception_handler(ValidationError)
def invalid(request: HttpRequest, error: ValidationError) -> HttpResponse:
    first = error.errors[0] if error.errors else {}
    loc = list(first.get("loc", []))
    where = ".".join(str(p) for p in loc)
    # The insights answer a bad query with their own key, whether the schema or their parser refused it.
    insights = request.path.startswith(("/api/v1/insights/", "/api/v1/findings"))
    key = "invalid_query" if insights and loc[:1] == ["query"] else "invalid_request"
    return error_response(request, key, f"{where}: {first.get('msg', 'invalid')}", 400)


@api.exception_handler(HttpError)
def http_error(request: HttpRequest, error: HttpError) -> HttpResponse:
    if isinstance(error.__cause__, KernelError):
        # The strict parser's typed refusal, which ninja wraps as "Cannot parse request body".
        return kernel_error(request, error.__cause__)
    key = "forbidden" if error.status_code == 403 else "http_error"
    return error_response(request, key, str(error), error.status_code)


for router in (
    runs_router,
    inbox_router,
    approvals_router,
    agents_router,
    executors_router,
    insights_router,
    holds_router,
    notify_router,
    audit_router,
    schedules_router,
    walls_router,
    approvers_router,
    evals_router,
):
    api.add_router("", router)

if django_apps.is_installed("testtools"):  # only with OZ0_TEST_TOOLS=1 (oz0site.settings)
    from testtools.api import router as testtools_router

    api.add_router("", testtools_router)
