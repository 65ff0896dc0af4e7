"""A failure's group, as Sentry groups errors: kind, agent, error key and the shape of its message.

The shape is the message with what varies from one run to the next masked — quoted values,
ids, numbers — so "record 'ab12' not found after 3 tries" and "record 'zz9' not found after
7 tries" are one group. The kernel stamps a finding with its fingerprint when it writes it
(runs.kernel.settling), so grouping a million findings is an indexed read, not a regex each.

A fingerprint is a digest of the shape: it is never shown (a viewer could test guesses of words
against it); surfaces name a group by its row's id.
"""

from __future__ import annotations

import hashlib
import re

SHAPE_MAX = 500
QUOTED = re.compile(r"'[^'\n]{0,200}'|\"[^\"\n]{0,200}\"|`[^`\n]{0,200}`")
UUID = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")
# A number (a unit after it stays: `12.5s` is `<n>s`); then a word with a digit in it, an id (`A1234`, `0x1f`).
NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:[.,]\d+)*")
ID_WORD = re.compile(r"\b\w*\d\w*\b")
SPACES = re.compile(r"\s+")


def message_shape(message: str | None) -> str:
    """The message with quoted values, ids and numbers masked, spaces collapsed, at most SHAPE_MAX characters."""
    if not message:
        return ""
    shape = QUOTED.sub("'…'", message)
    shape = UUID.sub("<id>", shape)
    shape = NUMBER.sub("<n>", shape)
    shape = ID_WORD.sub("<id>", shape)
    return SPACES.sub(" ", shape).strip()[:SHAPE_MAX]


def failure_fingerprint(*, kind: str, agent: str, error_key: str, message: str | None) -> str:
    """The group a failure belongs to: 32 hex digits of the digest of kind, agent, error key and shape."""
    text = "\x1f".join((kind, agent, error_key, message_shape(message)))
    return hashlib.sha256(text.encode()).hexdigest()[:32]
