"""The JSON API (API.md): one NinjaAPI, bearer tokens or the console's session, typed errors."""

from __future__ import annotations

import hashlib
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.security import HttpBearer, SessionAuth

from runs.kernel.errors import KernelError
from runs.models import ApiToken


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class BearerAuth(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> Any:
        row = ApiToken.objects.select_related("user").filter(digest=token_digest(token)).first()
        if row is None or not row.user.is_active:
            return None
        ApiToken.objects.filter(pk=row.pk).update(last_used_at=timezone.now())
        request.user = row.user
        return row.user


api = NinjaAPI(
    title="oz0",
    version="1",
    description="oz0's run engine: create runs, read their trace, and repair them.",
    urls_namespace="api",
    auth=[BearerAuth(), SessionAuth()],
    openapi_extra={"info": {"x-oz0-failures": {}}},
)


def error_response(request: HttpRequest, key: str, detail: str, status: int) -> HttpResponse:
    return api.create_response(request, {"error": {"key": key, "detail": detail}}, status=status)


@api.exception_handler(KernelError)
def kernel_error(request: HttpRequest, error: KernelError) -> HttpResponse:
    return error_response(request, error.key, error.detail, error.status)


@api.exception_handler(AuthenticationError)
def unauthenticated(request: HttpRequest, error: AuthenticationError) -> HttpResponse:
    return error_response(request, "unauthenticated", "sign in, or send Authorization: Bearer <token>", 401)


@api.exception_handler(ValidationError)
def invalid(request: HttpRequest, error: ValidationError) -> HttpResponse:
    first = error.errors[0] if error.errors else {}
    where = ".".join(str(p) for p in first.get("loc", []))
    return error_response(request, "invalid_request", f"{where}: {first.get('msg', 'invalid')}", 400)


@api.exception_handler(HttpError)
def http_error(request: HttpRequest, error: HttpError) -> HttpResponse:
    key = "forbidden" if error.status_code == 403 else "http_error"
    return error_response(request, key, str(error), error.status_code)


def _register_routers() -> None:
    from runs.api import router as runs_router

    api.add_router("", runs_router)
    from inbox.api import router as inbox_router

    api.add_router("", inbox_router)
    try:
        from insights.api import router as insights_router
    except ImportError:
        pass
    else:
        api.add_router("", insights_router)


_register_routers()
