"""Who a JSON API request speaks for: a person, by bearer token or by the console's session.

Executors authenticate with tokens of their own (`runs.executor_api.router.ExecutorAuth`).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import Q
from django.http import HttpRequest
from django.utils import timezone
from ninja.security import HttpBearer, SessionAuth

from runs.models import ApiToken
from runs.tokens import token_digest

# A token's "last used" is kept to the minute: a client making many requests a second must not
# pay a write (and its commit) on every one of them.
LAST_USED_GRAIN = timedelta(minutes=1)


def token_user(token: str) -> Any:
    """The active user a bearer token stands for: never a revoked or expired token's."""
    now = timezone.now()
    row = (
        ApiToken.objects.select_related("user")
        .filter(digest=token_digest(token), revoked_at__isnull=True)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        .first()
    )
    if row is None or not row.user.is_active:
        return None
    if row.last_used_at is None or now - row.last_used_at >= LAST_USED_GRAIN:
        ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
    return row.user


class BearerAuth(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> Any:
        user = token_user(token)
        if user is not None:
            request.user = user
        return user


def person_auth() -> list[Any]:
    """A person's bearer token, else their console session."""
    return [BearerAuth(), SessionAuth()]
