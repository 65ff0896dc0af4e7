"""API tokens can be listed, revoked and given an expiry: `./oz0 token list|revoke`, `create --expires-in`."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
import time_machine
from django.core.management import CommandError, call_command
from django.utils import timezone

from tenancy.models import ApiToken
from tests.conftest import Api

pytestmark = pytest.mark.django_db


def _create(*extra: str, username: str = "tok-user") -> str:
    out = StringIO()
    call_command("token_create", username, "--workspace", "tok-ws", "--role", "viewer", *extra, stdout=out)
    return out.getvalue().strip().splitlines()[-1]


def _works(token: str) -> bool:
    return Api(token).get("/workspaces/tok-ws/runs")[0] == 200


def test_it_gives_a_token_an_expiry_after_which_it_works_no_more() -> None:
    """Before, a token lived forever: there was no expiry at all."""
    token = _create("--expires-in", "1")
    row = ApiToken.objects.get(hint=token[:6])
    assert row.expires_at is not None and timedelta(hours=23) < row.expires_at - timezone.now() <= timedelta(days=1)
    assert _works(token)
    with time_machine.travel(timezone.now() + timedelta(days=1, minutes=1)):
        status, body = Api(token).get("/workspaces/tok-ws/runs")
        assert status == 401 and body["error"]["key"] == "unauthenticated"


@pytest.mark.parametrize("days", ["0", "3651", "-2"])
def test_it_refuses_an_expiry_out_of_range(days: str) -> None:
    with pytest.raises(CommandError, match="from 1 to 3650 days"):
        _create("--expires-in", days)
    assert not ApiToken.objects.filter(user__username="tok-user").exists()


def test_it_lists_a_users_tokens_with_their_status_and_never_the_token() -> None:
    live = _create("--label", "ci-deploy")
    revoked = _create("--label", "old-laptop")
    expiring = _create("--label", "short", "--expires-in", "1")
    other = _create(username="someone-else")
    call_command("token_revoke", str(ApiToken.objects.get(hint=revoked[:6]).pk), stdout=StringIO())
    out = StringIO()
    with time_machine.travel(timezone.now() + timedelta(days=2)):
        call_command("token_list", "tok-user", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["id", "hint", "label", "created", "last", "used", "expires", "status"]
    by_label = {line.split()[2]: line for line in lines[1:]}
    assert set(by_label) == {"ci-deploy", "old-laptop", "short"}
    assert by_label["ci-deploy"].endswith("live") and by_label["old-laptop"].endswith("revoked")
    assert by_label["short"].endswith("expired")
    assert f"{live[:6]}…" in by_label["ci-deploy"]
    for token in (live, revoked, expiring, other):
        assert token not in out.getvalue()
    with pytest.raises(CommandError, match="no such user"):
        call_command("token_list", "nobody-at-all", stdout=StringIO())


def test_it_revokes_a_token_by_id() -> None:
    """Before, a leaked token could not be revoked short of deleting its row by hand."""
    token = _create()
    keep = _create()
    row = ApiToken.objects.get(hint=token[:6])
    out = StringIO()
    call_command("token_revoke", str(row.pk), stdout=out)
    assert f"revoked token {row.pk}" in out.getvalue()
    assert not _works(token) and _works(keep)
    with pytest.raises(CommandError, match="already revoked"):
        call_command("token_revoke", str(row.pk), stdout=StringIO())
    with pytest.raises(CommandError, match="no such token"):
        call_command("token_revoke", "99999999", "abc", stdout=StringIO())


def test_it_keeps_last_used_to_the_minute_without_a_write_per_request() -> None:
    """A client making many requests a second paid an UPDATE and a commit of its token on each."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    token = _create()
    row = ApiToken.objects.get(hint=token[:6])
    assert row.last_used_at is None
    assert _works(token)
    first = ApiToken.objects.get(pk=row.pk).last_used_at
    assert first is not None
    with CaptureQueriesContext(connection) as queries:
        assert _works(token)
    assert not [q for q in queries.captured_queries if q["sql"].startswith("UPDATE") and "runs_apitoken" in q["sql"]]
    assert ApiToken.objects.get(pk=row.pk).last_used_at == first
    with time_machine.travel(timezone.now() + timedelta(minutes=2)):
        assert _works(token)
        later = ApiToken.objects.get(pk=row.pk).last_used_at
    assert later is not None and later > first


def test_a_token_stands_for_its_whole_person_and_a_deactivated_persons_for_nobody() -> None:
    """The token's person is read with the token in one written-out statement: the user it gives
    is the stored person, every field, and one deactivated since authenticates nobody."""
    from django.contrib.auth import get_user_model

    from tenancy.tokens import token_user

    token = _create(username="tok-whole")
    stored = get_user_model().objects.get(username="tok-whole")
    found = token_user(token)
    assert found == stored and found._state.adding is False and found._state.db == "default"
    fields = [field.attname for field in get_user_model()._meta.concrete_fields]
    assert {name: getattr(found, name) for name in fields} == {name: getattr(stored, name) for name in fields}
    assert token_user(token + "x") is None and token_user("") is None
    get_user_model().objects.filter(pk=stored.pk).update(is_active=False)
    assert token_user(token) is None and not _works(token)


def test_the_list_the_count_and_the_sign_in_agree_on_which_tokens_are_live_to_the_instant() -> None:
    """One rule, said in SQL (`live`, the cap on live tokens) and in Python (`status_of`, the list;
    `token_user`, every API request): revoked, expired at this very instant, or live."""
    from django.contrib.auth import get_user_model

    from tenancy import tokens

    person = get_user_model().objects.create_user("tok-rule", password="x")
    now = timezone.now()
    made = {}
    for name, expires_at, revoked_at in [
        ("forever", None, None),
        ("later", now + timedelta(microseconds=1), None),
        ("this_instant", now, None),
        ("before", now - timedelta(days=1), None),
        ("revoked", now + timedelta(days=1), now - timedelta(seconds=1)),
    ]:
        token, row = tokens.issue(user=person, label=name)
        ApiToken.objects.filter(pk=row.pk).update(expires_at=expires_at, revoked_at=revoked_at)
        made[name] = (token, ApiToken.objects.get(pk=row.pk))
    with time_machine.travel(now, tick=False):
        in_sql = {row.label for row in tokens.live(ApiToken.objects.filter(user=person))}
        by_status = {name: tokens.status_of(row) for name, (_, row) in made.items()}
        signed_in = {name for name, (token, _) in made.items() if tokens.token_user(token) == person}
    assert by_status == {
        "forever": "live",
        "later": "live",
        "this_instant": "expired",
        "before": "expired",
        "revoked": "revoked",
    }
    assert in_sql == signed_in == {"forever", "later"}
