"""Sign-in with a throttle: repeated failures for one username from one address, or many from one
address, are refused for a while before the password is even checked.

Counters live in the cache (Redis), so every web process shares them. Failures are counted per
(address, username), so an attacker guessing one person's password locks only their own address
out of that account, never the person signing in from elsewhere; and per address, so one address
cannot spray guesses across many accounts.

Every sign-in path counts and is refused alike: failures are counted from Django's
`user_login_failed` signal (which `authenticate()` sends for the console's form, the admin's and
any other), and the first authentication backend (`ThrottleBackend`) refuses a throttled name
before any password is hashed. The console's form answers 429 with a page saying so. A username
is keyed in the form Django authenticates (NFKC) and case-folded, so a full-width or upper-case
look-alike of a name is the same counter, never five more guesses.
"""

from __future__ import annotations

import hashlib
import unicodedata
from typing import Any

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse

WINDOW_SECONDS = 15 * 60
FAILURES_PER_ACCOUNT = 5
FAILURES_PER_ADDRESS = 50
USERNAME_MAX = 150


def client_address(request: HttpRequest) -> str:
    """The caller's address: behind a proxy (OZ0_BEHIND_PROXY=1), the one the proxy appended last
    to X-Forwarded-For (the entries before it are the client's own claims)."""
    if settings.OZ0_BEHIND_PROXY:
        forwarded = [part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if part.strip()]
        if forwarded:
            return forwarded[-1]
    return str(request.META.get("REMOTE_ADDR", ""))


def throttle_name(username: Any) -> str:
    """The name a counter keys on: NFKC (as Django normalises a username before it looks it up),
    case-folded, stripped. `ＡＬＩＣＥ`, `Alice` and `alice` are one account's counter."""
    return unicodedata.normalize("NFKC", str(username or "")[:USERNAME_MAX]).casefold().strip()


def _keys(request: HttpRequest, username: Any) -> tuple[str, str]:
    # Accounts are rows of one database: installs (and test sessions) sharing a Redis keep apart.
    install = connection.settings_dict["NAME"]
    address = client_address(request)
    account = hashlib.sha256(f"{install}\0{address}\0{throttle_name(username)}".encode()).hexdigest()[:32]
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


def throttled(request: HttpRequest, username: Any) -> bool:
    account, address = _keys(request, username)
    return _count(account) >= FAILURES_PER_ACCOUNT or _count(address) >= FAILURES_PER_ADDRESS


def _username_of(credentials: dict[str, Any]) -> Any:
    return credentials.get("username", credentials.get("email", ""))


@receiver(user_login_failed, dispatch_uid="oz0-login-failed")
def count_failure(sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any) -> None:
    """Every failed `authenticate()` with a request (the console's sign-in, the admin's, any form)."""
    if request is None:
        return
    account, address = _keys(request, _username_of(credentials))
    _fail(account)
    _fail(address)


@receiver(user_logged_in, dispatch_uid="oz0-login-succeeded")
def forget_failures(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    if request is None:
        return
    account, _ = _keys(request, user.get_username())
    cache.delete(account)


class ThrottleBackend:
    """First in AUTHENTICATION_BACKENDS: a throttled (address, name) is refused before any backend
    checks a password, on every sign-in path. PermissionDenied stops `authenticate()` there (and
    it still sends `user_login_failed`, so guessing on keeps the counter full). It has no
    `get_user`, so no session ever names it (the test client's `force_login` skips it)."""

    def authenticate(self, request: HttpRequest | None, username: Any = None, **kwargs: Any) -> None:
        if request is not None and username is not None and throttled(request, username):
            raise PermissionDenied("too many failed sign-ins")
        return None


class ThrottledLoginView(auth_views.LoginView):
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        return super().get_context_data(
            sso=settings.OZ0_SSO,
            sso_name=settings.OZ0_OIDC_PROVIDER_NAME,
            sso_failed=self.request.GET.get("sso") == "failed",
            local_passwords=not settings.OZ0_SSO or settings.OZ0_LOCAL_PASSWORDS,
            **kwargs,
        )

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if settings.OZ0_SSO and not settings.OZ0_LOCAL_PASSWORDS:
            context = self.get_context_data(form=AuthenticationForm(request, data=None), passwords_off=True)
            return self.render_to_response(context, status=403)
        if throttled(request, request.POST.get("username", "")):
            form = AuthenticationForm(request, data=None)
            context = self.get_context_data(form=form, throttled=True, throttle_minutes=WINDOW_SECONDS // 60)
            return self.render_to_response(context, status=429)
        return super().post(request, *args, **kwargs)
