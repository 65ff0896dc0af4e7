"""A stamp per user that changes whenever their memberships (or the account itself) change.

Live sockets re-check membership before every push: comparing the stamp costs one cache read,
and only a changed stamp costs a database read. Signals bump it on every save and delete of a
membership or a user (`RunsConfig.ready`).
"""

from __future__ import annotations

import uuid
from typing import Any

from django.core.cache import cache
from django.db import connection


def stamp_key(user_id: Any) -> str:
    # Users are rows of one database: installs (and test sessions) sharing a Redis keep apart.
    return f"oz0:membership:{connection.settings_dict['NAME']}:{user_id}"


def current_stamp(user_id: Any) -> str | None:
    value = cache.get(stamp_key(user_id))
    return str(value) if value is not None else None


def bump(user_id: Any) -> None:
    cache.set(stamp_key(user_id), uuid.uuid4().hex, timeout=None)


def membership_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    bump(instance.user_id)


def user_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    bump(instance.pk)
