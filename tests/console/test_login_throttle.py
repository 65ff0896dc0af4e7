"""Sign-in is throttled: repeated failures are refused (429) for a while, without locking others out."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.test import Client, RequestFactory

from oz0site import login
from tests.conftest import wait_for
from tests.factories import make_user

pytestmark = pytest.mark.django_db

PASSWORD = "pw-for-tests-only"


def _address() -> str:
    raw = uuid.uuid4().bytes
    return f"10.{raw[0]}.{raw[1]}.{raw[2]}"


def _sign_in(address: str, username: str, password: str, **extra: Any) -> tuple[int, bool]:
    client = Client(REMOTE_ADDR=address, **extra)
    response = client.post("/login/", {"username": username, "password": password})
    return response.status_code, "_auth_user_id" in client.session


def test_it_refuses_an_account_after_repeated_failures_from_one_address() -> None:
    """Before, /login/ let anyone guess passwords as fast as they could send them."""
    user = make_user()
    address = _address()
    for _ in range(login.FAILURES_PER_ACCOUNT):
        assert _sign_in(address, user.username, "wrong") == (200, False)
    status, signed_in = _sign_in(address, user.username, PASSWORD)
    assert (status, signed_in) == (429, False)
    client = Client(REMOTE_ADDR=address)
    page = client.post("/login/", {"username": user.username, "password": PASSWORD}).content.decode()
    assert "Too many failed sign-ins" in page


def test_it_does_not_lock_the_person_out_from_elsewhere_or_others_from_here() -> None:
    victim, neighbour = make_user(), make_user()
    attacker = _address()
    for _ in range(login.FAILURES_PER_ACCOUNT + 3):
        _sign_in(attacker, victim.username, "guess")
    assert _sign_in(_address(), victim.username, PASSWORD) == (302, True)
    assert _sign_in(attacker, neighbour.username, PASSWORD) == (302, True)


def test_it_caps_one_address_spraying_many_accounts() -> None:
    address = _address()
    for index in range(login.FAILURES_PER_ADDRESS):
        _sign_in(address, f"nobody-{index}", "guess")
    user = make_user()
    assert _sign_in(address, user.username, PASSWORD) == (429, False)
    assert _sign_in(_address(), user.username, PASSWORD) == (302, True)


def test_it_forgets_failures_after_a_success_and_after_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    user = make_user()
    address = _address()
    for _ in range(login.FAILURES_PER_ACCOUNT - 1):
        _sign_in(address, user.username, "wrong")
    assert _sign_in(address, user.username, PASSWORD) == (302, True)
    for _ in range(login.FAILURES_PER_ACCOUNT - 1):
        assert _sign_in(address, user.username, "wrong")[0] == 200  # counting from zero again

    monkeypatch.setattr(login, "WINDOW_SECONDS", 2)
    other, later = make_user(), _address()
    request = RequestFactory().post("/login/", REMOTE_ADDR=later)
    account, _ = login._keys(request, other.username)
    for _ in range(login.FAILURES_PER_ACCOUNT):
        login._fail(account)  # as failed sign-ins would, but within the short window
    assert _sign_in(later, other.username, PASSWORD)[0] == 429
    wait_for(lambda: _sign_in(later, other.username, PASSWORD) == (302, True), timeout=10, message="the window to pass")


def test_it_counts_the_address_the_proxy_saw_not_the_one_the_client_claims(settings: Any) -> None:
    settings.OZ0_BEHIND_PROXY = True
    user = make_user()
    real = _address()
    for _ in range(login.FAILURES_PER_ACCOUNT):
        # A client forging a fresh X-Forwarded-For each time still comes from the same real address.
        _sign_in("127.0.0.1", user.username, "wrong", HTTP_X_FORWARDED_FOR=f"{_address()}, {real}")
    assert _sign_in("127.0.0.1", user.username, PASSWORD, HTTP_X_FORWARDED_FOR=f"1.2.3.4, {real}")[0] == 429
    assert _sign_in("127.0.0.1", user.username, PASSWORD, HTTP_X_FORWARDED_FOR=_address()) == (302, True)


def test_it_refuses_a_huge_username_typed_not_with_an_error() -> None:
    status, signed_in = _sign_in(_address(), "u" * 100_000, "x")
    assert status == 200 and not signed_in
