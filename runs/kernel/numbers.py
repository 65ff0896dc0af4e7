"""What a JSON number is, read the way JSON Schema reads it (a rule of the request contract that
the pure rules below it use too)."""

from __future__ import annotations

from typing import Any


def whole_number(value: Any) -> int | None:
    """The whole number a JSON number is, or None: JSON has one number type, so 2.0 is the whole
    number 2 (as JSON Schema's `integer` says); true is no number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None
