from __future__ import annotations

import time
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse

# Only the app's own scripts and styles; htmx and the API docs' Swagger UI run from /static, never
# inline. `connect-src 'self'` covers the console's own websocket (same host, ws: or wss:).
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'self'; form-action 'self'"
)


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response.setdefault("Content-Security-Policy", CSP)
        return response


class RefuseNulMiddleware:
    """A NUL in the path or the query string reaches no view: PostgreSQL cannot hold one in a
    text value, so a lookup by it would fail as a 500. The API answers its typed error."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        query = ((key, value) for key, values in request.GET.lists() for value in values)
        if "\x00" in request.path or any("\x00" in key or "\x00" in value for key, value in query):
            detail = "the path or the query string holds a NUL byte"
            if request.path.startswith("/api/"):
                return JsonResponse({"error": {"key": "nul_byte", "detail": detail}}, status=400)
            return HttpResponseBadRequest(detail)
        return self.get_response(request)


KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class RequestMetricsMiddleware:
    """Each request's time, by method, route (the URL pattern, never the path: ids would make a
    series each) and status class, into /metrics's histogram (counted in memory, see oz0site/metering.py)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        from oz0site.metering import meter

        started = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        route = str(match.route) if match is not None and match.route else "unmatched"
        method = request.method if request.method in KNOWN_METHODS else "other"
        labels = (("method", method or "other"), ("route", route), ("status", f"{response.status_code // 100}xx"))
        meter.observe("oz0_http_request_duration_seconds", labels, time.perf_counter() - started)
        return response
