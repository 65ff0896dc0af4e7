"""Sign-in with a throttle: repeated failures for one username from one address, or many from one
address, are refused for a while (429) before the password is even checked.

Counters live in the cache (Redis), so every web process shares them. Failures are counted per
(address, username), so an attacker guessing one person's password locks only their own address
out of that account, never the person signing in from elsewhere; and per address, so one address
cannot spray guesses across many accounts.
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.core.cache import cache
from django.db import connection
from django.http import HttpRequest, HttpResponse

WINDOW_SECONDS = 15 * 60
FAILURES_PER_ACCOUNT = 5
FAILURES_PER_ADDRESS = 50


def client_address(request: HttpRequest) -> str:
    """The caller's address: behind a proxy (OZ0_BEHIND_PROXY=1), the one the proxy appended last
    to X-Forwarded-For (the entries before it are the client's own claims)."""
    if settings.OZ0_BEHIND_PROXY:
        forwarded = [part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if part.strip()]
        if forwarded:
            return forwarded[-1]
    return str(request.META.get("REMOTE_ADDR", ""))


def _keys(request: HttpRequest, username: str) -> tuple[str, str]:
    # Accounts are rows of one database: installs (and test sessions) sharing a Redis keep apart.
    install = connection.settings_dict["NAME"]
    address = client_address(request)
    account = hashlib.sha256(f"{install}\0{address}\0{username.strip().lower()}".encode()).hexdigest()[:32]
    by_address = hashlib.sha256(f"{install}\0{address}".encode()).hexdigest()[:32]
    return f"oz0:login:account:{account}", f"oz0:login:address:{by_address}"


def _count(key: str) -> int:
    return int(cache.get(key) or 0)


def _fail(key: str) -> None:
    cache.add(key, 0, timeout=WINDOW_SECONDS)
    try:
        cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.set(key, 1, timeout=WINDOW_SECONDS)


def throttled(request: HttpRequest, username: str) -> bool:
    account, address = _keys(request, username)
    return _count(account) >= FAILURES_PER_ACCOUNT or _count(address) >= FAILURES_PER_ADDRESS


class ThrottledLoginView(auth_views.LoginView):
    redirect_authenticated_user = True

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        username = str(request.POST.get("username", ""))[:150]
        if throttled(request, username):
            form = AuthenticationForm(request, data=None)
            context = self.get_context_data(form=form, throttled=True, throttle_minutes=WINDOW_SECONDS // 60)
            return self.render_to_response(context, status=429)
        return super().post(request, *args, **kwargs)

    def form_invalid(self, form: Any) -> HttpResponse:
        account, address = _keys(self.request, str(self.request.POST.get("username", ""))[:150])
        _fail(account)
        _fail(address)
        return super().form_invalid(form)

    def form_valid(self, form: Any) -> HttpResponse:
        account, _ = _keys(self.request, str(self.request.POST.get("username", ""))[:150])
        cache.delete(account)
        return super().form_valid(form)
