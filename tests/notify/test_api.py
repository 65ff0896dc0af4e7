"""GET/POST/DELETE /api/v1/subscriptions: one's own subscriptions, every role, bad input typed."""

from __future__ import annotations

from typing import Any

import pytest

from notify.models import Subscription
from tests.conftest import Api, Team

pytestmark = pytest.mark.django_db

HOOK = "https://hooks.example.com/services/T0/B0/secret-path"


def body(team: Team, **fields: Any) -> dict[str, Any]:
    return {"workspace": team.slug, "kinds": ["approval", "hold"], "webhook_url": HOOK, **fields}


@pytest.mark.parametrize(("role", "status"), [("operator", 201), ("reader", 201), ("viewer", 201), ("outsider", 404)])
def test_every_member_may_subscribe_and_an_outsider_finds_no_workspace(team: Team, role: str, status: int) -> None:
    code, doc = team.api(role).post("/subscriptions", body(team))
    assert code == status, doc
    if status == 201:
        assert doc["workspace"] == team.slug and doc["kinds"] == ["approval", "hold"]
        assert doc["status"] == "no digest yet" and doc["consecutive_failures"] == 0
        # The secret is shown once; the URL (itself a credential) only by its host.
        assert len(doc["secret"]) >= 40 and doc["webhook"] == "https://hooks.example.com/…"
        row = Subscription.objects.get(pk=doc["id"])
        assert row.user == team.users[role] and row.webhook_url == HOOK
    else:
        assert doc["error"]["key"] == "not_found"
        assert not Subscription.objects.exists()


def test_a_list_shows_ones_own_subscriptions_without_their_secrets(team: Team) -> None:
    _, mine = team.api("reader").post("/subscriptions", body(team, interval_seconds=600))
    team.api("viewer").post("/subscriptions", body(team))
    code, page = team.api("reader").get("/subscriptions")
    assert code == 200
    assert [item["id"] for item in page["items"]] == [mine["id"]]
    item = page["items"][0]
    assert "secret" not in item and HOOK not in str(page) and item["interval_seconds"] == 600
    assert team.api("reader").get(f"/subscriptions?workspace={team.slug}")[1]["items"][0]["id"] == mine["id"]
    assert team.api("reader").get("/subscriptions?workspace=elsewhere")[1]["items"] == []
    assert team.api("outsider").get("/subscriptions") == (200, {"items": [], "next": None})


def test_delete_removes_ones_own_and_nobody_elses(team: Team) -> None:
    _, mine = team.api("reader").post("/subscriptions", body(team))
    for role in ("operator", "viewer", "outsider"):
        code, doc = team.api(role).call("DELETE", f"/subscriptions/{mine['id']}")
        assert (code, doc["error"]["key"]) == (404, "not_found")
    assert Subscription.objects.filter(pk=mine["id"]).exists()
    assert team.api("reader").call("DELETE", f"/subscriptions/{mine['id']}")[0] == 204
    assert not Subscription.objects.exists()
    assert team.api("reader").call("DELETE", f"/subscriptions/{mine['id']}")[0] == 404
    assert team.api("reader").call("DELETE", "/subscriptions/99999999999999999999999")[0] in (400, 404)


def test_without_credentials_it_is_401(team: Team) -> None:
    from django.test import Client

    client = Client()
    assert client.get("/api/v1/subscriptions").status_code == 401
    assert client.post("/api/v1/subscriptions", "{}", content_type="application/json").status_code == 401


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({"kinds": []}, "invalid_kinds"),
        ({"kinds": ["approval", "approval"]}, "invalid_kinds"),
        ({"kinds": ["everything"]}, "invalid_kinds"),
        ({"kinds": "approval"}, "invalid_kinds"),
        ({"kinds": [["approval"]]}, "invalid_kinds"),
        ({"kinds": [{"a": {"b": {"c": 1}}}]}, "invalid_kinds"),
        ({"interval_seconds": 60}, "invalid_interval"),
        ({"interval_seconds": 10**30}, "invalid_interval"),
        ({"interval_seconds": "900"}, "invalid_interval"),
        ({"interval_seconds": True}, "invalid_interval"),
        ({"agent": "x" * 101}, "invalid_agent"),
        ({"agent": ["a"]}, "invalid_agent"),
        ({"email": "yes"}, "invalid_email"),
        ({"webhook_url": None, "email": False}, "no_channel"),
        ({"webhook_url": None, "email": True}, "no_email_address"),
        ({"webhook_url": "ftp://hooks.example.com/x"}, "invalid_webhook_url"),
        ({"webhook_url": "javascript:alert(1)"}, "invalid_webhook_url"),
        ({"webhook_url": "https://user:pw@hooks.example.com/x"}, "invalid_webhook_url"),
        ({"webhook_url": "https://hooks.example.com/a b"}, "invalid_webhook_url"),
        ({"webhook_url": "https:///nohost"}, "invalid_webhook_url"),
        ({"webhook_url": "https://hooks.example.com:99999/x"}, "invalid_webhook_url"),
        ({"webhook_url": "https://" + "a" * 2000 + ".com/"}, "invalid_webhook_url"),
        ({"webhook_url": {"url": HOOK}}, "invalid_webhook_url"),
        ({"webhook_url": "http://127.0.0.1:8000/hook"}, "private_webhook_url"),
        ({"webhook_url": "http://10.1.2.3/hook"}, "private_webhook_url"),
        ({"webhook_url": "http://169.254.169.254/latest/meta-data"}, "private_webhook_url"),
        ({"webhook_url": "http://[::1]/hook"}, "private_webhook_url"),
        ({"webhook_url": "http://[::ffff:127.0.0.1]/hook"}, "private_webhook_url"),
        ({"webhook_url": "http://localhost/hook"}, "private_webhook_url"),
        ({"webhook_url": "http://metadata.google.internal/hook"}, "private_webhook_url"),
        ({"webhook_url": "http://intranet/hook"}, "private_webhook_url"),
        ({"workspace": 7}, "invalid_workspace"),
        ({"workspace": ""}, "invalid_workspace"),
        ({"surprise": 1}, "unknown_field"),
    ],
)
def test_bad_input_is_a_typed_400_and_writes_nothing(team: Team, fields: dict[str, Any], key: str) -> None:
    code, doc = team.api("operator").post("/subscriptions", body(team, **fields))
    assert (code, doc["error"]["key"]) == (400, key), doc
    assert not Subscription.objects.exists()


@pytest.mark.spec("S30", "S31")
@pytest.mark.parametrize(
    ("raw", "status", "key"),
    [
        ("{not json", 400, "invalid_json"),
        ("[1, 2]", 400, "invalid_request"),
        ('"text"', 400, "invalid_request"),
        ("[" * 5000 + "]" * 5000, 400, "too_deep"),
        ('{"workspace": "a\\u0000b"}', 400, None),
        ('{"interval_seconds": 1e3}', 400, None),
        ('{"agent": "' + "x" * (1024 * 1024 + 10) + '"}', 413, "payload_too_large"),
    ],
)
def test_malformed_huge_and_nested_bodies_are_refused_typed(team: Team, raw: str, status: int, key: str | None) -> None:
    code, doc = team.api("operator").post("/subscriptions", raw=raw)
    assert code == status, doc
    assert isinstance(doc, dict) and doc["error"]["key"]
    if key:
        assert doc["error"]["key"] == key
    assert not Subscription.objects.exists()


def test_private_webhooks_may_be_allowed_by_setting(team: Team, settings: Any) -> None:
    settings.OZ0_NOTIFY_PRIVATE_WEBHOOKS = True
    code, doc = team.api("operator").post("/subscriptions", body(team, webhook_url="http://127.0.0.1:9/hook"))
    assert code == 201, doc


def test_e_mail_goes_to_the_accounts_own_address(team: Team) -> None:
    user = team.users["viewer"]
    user.email = "viewer@example.test"
    user.save()
    code, doc = team.api("viewer").post("/subscriptions", body(team, webhook_url=None, email=True, agent="a1"))
    assert code == 201, doc
    assert doc.get("secret") is None and doc["webhook"] is None and doc["email"] is True and doc["agent"] == "a1"


def test_one_person_holds_a_bounded_number(team: Team) -> None:
    from notify import subscriptions

    api: Api = team.api("viewer")
    for _ in range(subscriptions.PER_USER_MAX):
        assert api.post("/subscriptions", body(team))[0] == 201
    code, doc = api.post("/subscriptions", body(team))
    assert (code, doc["error"]["key"]) == (409, "too_many_subscriptions")
    assert Subscription.objects.count() == subscriptions.PER_USER_MAX
