from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

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
