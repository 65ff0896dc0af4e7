"""Failure groups' fingerprints (issue 31): the shape of a message masks what varies between runs."""

from __future__ import annotations

import pytest

from runs.fingerprints import SHAPE_MAX, failure_fingerprint, message_shape


@pytest.mark.spec("F18")
@pytest.mark.parametrize(
    ("message", "shape"),
    [
        ("record 'ab12' not found after 3 tries", "record '…' not found after <n> tries"),
        ('no "Jane Doe" in the roster', "no '…' in the roster"),
        ("run 3f2a9c1e-1111-2222-3333-444455556666 died", "run <id> died"),
        ("order A1234 failed at 12.5s", "order <id> failed at <n>s"),
        ("HTTP 503 from https://x.example/a/77", "HTTP <n> from https://x.example/a/<n>"),
        ("  spaced\n\tout  ", "spaced out"),
        ("", ""),
        (None, ""),
    ],
)
def test_it_masks_numbers_ids_and_quoted_values(message: str | None, shape: str) -> None:
    assert message_shape(message) == shape


@pytest.mark.spec("F18")
def test_it_caps_the_shape() -> None:
    assert len(message_shape("word " * 500)) == SHAPE_MAX


@pytest.mark.spec("F18")
def test_the_same_shape_is_one_group_and_any_other_part_another() -> None:
    base = {"kind": "not_found", "agent": "triage", "error_key": "oz_fail", "message": "user 17 not found"}
    same = failure_fingerprint(**base)
    assert failure_fingerprint(**{**base, "message": "user 9000 not found"}) == same
    assert len(same) == 32 and int(same, 16) >= 0
    for change in ({"kind": "timeout"}, {"agent": "other"}, {"error_key": ""}, {"message": "user 17 was found"}):
        assert failure_fingerprint(**{**base, **change}) != same, change
