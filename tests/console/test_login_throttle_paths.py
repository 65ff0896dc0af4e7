"""The sign-in throttle cannot be walked around: a look-alike of a name (full-width, upper case)
is the same counter, and the admin's sign-in counts and is refused like the console's (issue 27.6)."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth.models import User
from django.test import Client

from oz0site import login
from tests.factories import make_user

pytestmark = pytest.mark.django_db

PASSWORD = "pw-for-tests-only"


def _address() -> str:
    raw = uuid.uuid4().bytes
    return f"10.{raw[0]}.{raw[1]}.{raw[2]}"


def _full_width(name: str) -> str:
    """ASCII letters and digits as their full-width forms (U+FF01..U+FF5E), which NFKC folds back."""
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in name)


def _console(address: str, username: str, password: str) -> int:
    return Client(REMOTE_ADDR=address).post("/login/", {"username": username, "password": password}).status_code


def _admin(address: str, username: str, password: str) -> tuple[int, bool]:
    client = Client(REMOTE_ADDR=address)
    response = client.post("/admin/login/", {"username": username, "password": password, "next": "/admin/"})
    return response.status_code, "_auth_user_id" in client.session


def _staff() -> User:
    user = make_user()
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    return user


def test_it_counts_full_width_and_upper_case_look_alikes_as_the_same_name() -> None:
    """Before, the counter keyed on `username.lower()` while Django authenticated the NFKC form:
    each look-alike spelling got five more guesses at one account."""
    user = make_user()
    address = _address()
    variants = [user.username, _full_width(user.username), user.username.upper(), _full_width(user.username.upper())]
    assert len({*variants}) == 4
    for index in range(login.FAILURES_PER_ACCOUNT):
        assert _console(address, variants[index % len(variants)], "wrong") == 200
    for variant in variants:
        assert _console(address, variant, PASSWORD) == 429, variant
    assert _console(_address(), user.username, PASSWORD) == 302  # from elsewhere, still welcome
    assert {login.throttle_name(v) for v in variants} == {user.username.casefold()}


def test_it_counts_the_admins_failed_sign_ins_and_refuses_it_when_throttled() -> None:
    """Before, /admin/login/ was not throttled at all: guesses there were free and uncounted."""
    staff = _staff()
    address = _address()
    for _ in range(login.FAILURES_PER_ACCOUNT):
        assert _admin(address, _full_width(staff.username), "wrong") == (200, False)
    # The admin's right password is refused now, from this address, before it is checked...
    assert _admin(address, staff.username, PASSWORD) == (200, False)
    # ...and the console's sign-in shares the counter.
    assert _console(address, staff.username, PASSWORD) == 429
    assert _admin(_address(), staff.username, PASSWORD) == (302, True)


def test_it_counts_admin_failures_toward_the_address_cap() -> None:
    address = _address()
    for index in range(login.FAILURES_PER_ADDRESS):
        _admin(address, f"nobody-{index}", "guess")
    assert _console(address, make_user().username, PASSWORD) == 429


def test_a_success_on_the_admin_forgets_the_names_failures() -> None:
    staff = _staff()
    address = _address()
    for _ in range(login.FAILURES_PER_ACCOUNT - 1):
        _admin(address, staff.username, "wrong")
    assert _admin(address, staff.username, PASSWORD) == (302, True)
    for _ in range(login.FAILURES_PER_ACCOUNT - 1):
        assert _console(address, staff.username.upper(), "wrong") == 200
    assert _console(address, staff.username, PASSWORD) == 302
