"""API tokens: issue, list and revoke a person's bearer tokens, each with an optional expiry.

Only a token's SHA-256 is stored, with its first characters as a hint a person recognizes it by;
the token itself is shown once, when it is issued. A revoked or expired token authenticates
nobody (`token_user`; `oz0site.auth` wires it into the JSON API).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from tenancy.models import ApiToken

HINT_LENGTH = 6
LABEL_MAX = 100
EXPIRES_MAX_DAYS = 3650
# Live tokens one person may hold: enough for every script, few enough that nobody fills the table.
LIVE_MAX = 100
# A token's "last used" is kept to the minute: a client making many requests a second must not
# pay a write (and its commit) on every one of them.
LAST_USED_GRAIN = timedelta(minutes=1)


class TokenRefused(Exception):
    """A refused token request, typed like the kernel's refusals (tenancy imports no kernel):
    `key` as the API's error envelope names it, `detail` for a person, `status` its HTTP status."""

    def __init__(self, key: str, detail: str, *, status: int = 400) -> None:
        super().__init__(f"{key}: {detail}")
        self.key = key
        self.detail = detail
        self.status = status


def _not_found() -> TokenRefused:
    return TokenRefused("not_found", "no such token", status=404)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def live(tokens: QuerySet[ApiToken], now: datetime | None = None) -> QuerySet[ApiToken]:
    now = now or timezone.now()
    return tokens.filter(revoked_at__isnull=True).filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))


def expires_at(days: Any) -> datetime | None:
    """`days` from now (a whole number from 1 to 3650), or None for a token that never expires."""
    if days in (None, ""):
        return None
    try:
        count = int(str(days).strip())
    except ValueError:
        raise TokenRefused("invalid_field", "the expiry is a whole number of days") from None
    if not 1 <= count <= EXPIRES_MAX_DAYS:
        raise TokenRefused("invalid_field", f"the expiry is from 1 to {EXPIRES_MAX_DAYS} days")
    return timezone.now() + timedelta(days=count)


def issue(*, user: Any, label: Any = "", expires_in_days: Any = None) -> tuple[str, ApiToken]:
    """A new token for `user`: (the token, shown once; its row)."""
    if not isinstance(label, str) or len(label) > LABEL_MAX:
        raise TokenRefused("invalid_field", f"the label is text of at most {LABEL_MAX} characters")
    expiry = expires_at(expires_in_days)
    token = secrets.token_urlsafe(32)
    with transaction.atomic():
        # Serialize one person's issues so the cap holds under concurrent requests.
        get_user_model().objects.select_for_update().filter(pk=user.pk).first()
        if live(ApiToken.objects.filter(user_id=user.pk)).count() >= LIVE_MAX:
            raise TokenRefused("too_many_tokens", f"you hold {LIVE_MAX} live tokens; revoke one first", status=409)
        row = ApiToken.objects.create(
            user=user, digest=token_digest(token), hint=token[:HINT_LENGTH], label=label.strip(), expires_at=expiry
        )
    return token, row


def tokens_of(user: Any) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(user_id=user.pk).order_by("-created_at", "-pk")


def status_of(row: ApiToken, now: datetime | None = None) -> str:
    return _standing(row.revoked_at, row.expires_at, now or timezone.now())


def _standing(revoked_at: datetime | None, expires_at: datetime | None, now: datetime) -> str:
    """A token's standing: `live` authenticates; `live()` says the same of many rows in SQL."""
    if revoked_at is not None:
        return "revoked"
    if expires_at is not None and expires_at <= now:
        return "expired"
    return "live"


def revoke(*, token_id: Any, user: Any = None) -> ApiToken:
    """Revoke a token: its owner's (`user`), or anyone's when `user` is None (the command line)."""
    try:
        pk = int(str(token_id))
    except ValueError:
        raise _not_found() from None
    rows = ApiToken.objects.filter(pk=pk)
    if user is not None:
        rows = rows.filter(user_id=user.pk)
    row = rows.first()
    if row is None:
        raise _not_found()
    if row.revoked_at is not None:
        raise TokenRefused("token_revoked", "the token is already revoked", status=409)
    ApiToken.objects.filter(pk=row.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
    row.refresh_from_db()
    return row


def token_user(token: str) -> Any:
    """The active user a bearer token stands for: never a revoked or expired token's."""
    return token_user_and(token)[0]


@dataclass(frozen=True)
class Beside:
    """What else a caller reads in the token's own statement (one round trip, not two): `columns`
    to select, and `joins` onto the token's row (`token`: its user is `token.user_id`) with their
    `params`."""

    columns: str
    joins: str
    params: list[Any]


def token_user_and(token: str, beside: Beside | None = None) -> tuple[Any, tuple[Any, ...]]:
    """`token_user`'s user, and the values `beside` asked for (none without `beside` or a user)."""
    now = timezone.now()
    found = _token_and_user(token_digest(token), beside)
    if found is None:
        return None, ()
    token_id, revoked_at, expires_at, last_used_at, user, besides = found
    if _standing(revoked_at, expires_at, now) != "live" or not user.is_active:
        return None, ()
    if last_used_at is None or now - last_used_at >= LAST_USED_GRAIN:
        ApiToken.objects.filter(pk=token_id).update(last_used_at=now)
    return user, besides


def _token_and_user(
    digest: str, beside: Beside | None
) -> tuple[int, datetime | None, datetime | None, datetime | None, Any, tuple[Any, ...]] | None:
    """The token's row and its user (and what `beside` joins), read in one statement written out:
    this is every API request's first read, and the ORM's compiling of the joined query cost
    several times the query itself (about 0.7 ms of CPU against 0.1)."""
    user_model = get_user_model()
    fields = user_model._meta.concrete_fields
    extra_columns, joins, params = (f", {beside.columns}", f" {beside.joins}", beside.params) if beside else ("", "", [])
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT token.id, token.revoked_at, token.expires_at, token.last_used_at, "
            + ", ".join(f'person."{field.column}"' for field in fields)
            + extra_columns
            + f' FROM "{ApiToken._meta.db_table}" AS token JOIN "{user_model._meta.db_table}" AS person'
            f' ON person."{user_model._meta.pk.column}" = token.user_id{joins} WHERE token.digest = %s',
            [*params, digest],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    width = 4 + len(fields)
    user = user_model.from_db(connection.alias, [field.attname for field in fields], row[4:width])
    return row[0], row[1], row[2], row[3], user, tuple(row[width:])
