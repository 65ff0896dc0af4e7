"""Single sign-on (issue 33 item 5) against a real OpenID Connect provider started on loopback
(django-oidc-provider in its own process, tests/oidc_provider): the code flow with state, nonce
and PKCE, the ID token's signature checked against the provider's keys, people found by their
subject, workspace roles from the groups claim, local passwords optional."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.test import Client

from tenancy.models import Membership, SsoIdentity, Workspace
from tenancy.sso import check_configuration, parse_group_roles
from tests.conftest import Team
from tests.factories import make_user
from tests.tenancy.sso_provider import Provider, path_of, provider_redirect_back, start_provider

pytestmark = pytest.mark.django_db

BACKENDS = ["oz0site.login.ThrottleBackend", "django.contrib.auth.backends.ModelBackend", "tenancy.sso.SsoBackend"]


@pytest.fixture(scope="module")
def provider() -> Iterator[Provider]:
    started = start_provider("http://testserver/oidc/callback/")
    yield started
    os.killpg(started.process.pid, signal.SIGKILL)
    started.process.wait(timeout=10)


@pytest.fixture
def sso(provider: Provider, settings: Any, team: Team) -> Team:
    for name, value in provider.settings().items():
        setattr(settings, name, value)
    settings.AUTHENTICATION_BACKENDS = BACKENDS
    settings.OZ0_OIDC_GROUP_ROLES = (
        f"oz0-ops={team.slug}:operator, oz0-readers={team.slug}:reader, oz0-viewers={team.slug}:viewer"
    )
    return team


def sign_in(client: Client, username: str) -> Any:
    """The whole code flow; oz0's answer to the provider's redirect back."""
    started = client.get("/oidc/authenticate/")
    assert started.status_code == 302, started
    back = provider_redirect_back(started["Location"], username)
    assert back.startswith("http://testserver/oidc/callback/?"), back
    return client.get(path_of(back))


def signed_in_user(client: Client) -> Any:
    user_id = client.session.get("_auth_user_id")
    return get_user_model().objects.get(pk=user_id) if user_id else None


def role_in(user: Any, workspace: Workspace) -> str | None:
    return Membership.objects.filter(user=user, workspace=workspace).values_list("role", flat=True).first()


def test_a_person_signs_in_through_the_provider_and_holds_the_role_their_groups_map_to(sso: Team) -> None:
    client = Client()
    answer = sign_in(client, "alice")
    assert answer.status_code == 302 and answer["Location"] == "/"
    alice = signed_in_user(client)
    assert alice is not None and alice.username == "alice" and alice.email == "alice@example.test"
    assert not alice.has_usable_password()  # signs in through the provider only
    assert role_in(alice, sso.workspace) == "operator"
    identity = SsoIdentity.objects.get(user=alice)
    assert identity.issuer.endswith("/openid") and identity.subject
    assert client.get(f"/w/{sso.slug}/inbox/").status_code == 200
    # The next sign-in finds the same person by subject: no second account.
    again = Client()
    sign_in(again, "alice")
    assert signed_in_user(again) == alice and get_user_model().objects.filter(email="alice@example.test").count() == 1


def test_the_highest_role_of_the_groups_wins_and_a_group_mapped_nowhere_gives_no_membership(sso: Team) -> None:
    bob_client, carol_client = Client(), Client()
    sign_in(bob_client, "bob")  # readers and viewers
    sign_in(carol_client, "carol")  # payroll only
    assert role_in(signed_in_user(bob_client), sso.workspace) == "reader"
    carol = signed_in_user(carol_client)
    assert carol is not None and not Membership.objects.filter(user=carol).exists()
    assert carol_client.get(f"/w/{sso.slug}/inbox/").status_code == 404


def test_each_sign_in_follows_the_groups_and_leaves_workspaces_the_mapping_does_not_name(sso: Team, settings: Any) -> None:
    client = Client()
    sign_in(client, "alice")
    alice = signed_in_user(client)
    elsewhere = Team()
    Membership.objects.create(user=alice, workspace=elsewhere.workspace, role="reader")  # kept locally
    settings.OZ0_OIDC_GROUP_ROLES = f"oz0-readers={sso.slug}:operator"  # alice's group maps nowhere now
    sign_in(Client(), "alice")
    assert role_in(alice, sso.workspace) is None
    assert role_in(alice, elsewhere.workspace) == "reader"
    settings.OZ0_OIDC_GROUP_ROLES = f"oz0-ops={sso.slug}:viewer"
    sign_in(Client(), "alice")
    assert role_in(alice, sso.workspace) == "viewer"


def test_an_account_at_the_provider_claiming_a_local_persons_email_does_not_become_them(sso: Team) -> None:
    local = make_user()
    local.email = "erin@example.test"
    local.save()
    Membership.objects.create(user=local, workspace=sso.workspace, role="operator")
    client = Client()
    sign_in(client, "erin")
    erin = signed_in_user(client)
    assert erin is not None and erin != local
    assert role_in(erin, sso.workspace) == "viewer" and role_in(local, sso.workspace) == "operator"


def test_a_deactivated_person_is_refused_at_the_next_sign_in(sso: Team) -> None:
    client = Client()
    sign_in(client, "alice")
    alice = signed_in_user(client)
    alice.is_active = False
    alice.save()
    fresh = Client()
    answer = sign_in(fresh, "alice")
    assert answer.status_code == 302 and answer["Location"] == "/login/?sso=failed"
    assert signed_in_user(fresh) is None


def test_a_forged_state_or_a_replayed_code_signs_nobody_in_and_creates_nobody(sso: Team) -> None:
    client = Client()
    started = client.get("/oidc/authenticate/")
    back = provider_redirect_back(started["Location"], "bob")
    forged = path_of(back).replace("state=", "state=forged")
    answer = client.get(forged)
    assert answer.status_code in (302, 400) and signed_in_user(client) is None
    assert not SsoIdentity.objects.exists()
    # The honest redirect then signs in once; its code replayed in another browser does nothing.
    assert client.get(path_of(back)).status_code == 302 and signed_in_user(client) is not None
    other = Client()
    other.get("/oidc/authenticate/")
    replay = other.get(path_of(back))
    assert signed_in_user(other) is None and replay.status_code in (302, 400)
    assert SsoIdentity.objects.count() == 1


def test_an_id_token_from_another_issuer_is_refused(sso: Team, settings: Any) -> None:
    settings.OZ0_OIDC_ISSUER = "https://idp.elsewhere.test/openid"
    client = Client()
    answer = sign_in(client, "alice")
    assert answer["Location"] == "/login/?sso=failed" and signed_in_user(client) is None
    assert not SsoIdentity.objects.exists()


def test_with_local_passwords_off_no_sign_in_path_checks_a_password(sso: Team, settings: Any) -> None:
    user = make_user()
    user.set_password("a-local-password-1")
    user.save()
    form = {"username": user.username, "password": "a-local-password-1"}
    assert Client().post("/login/", form).status_code == 302  # on: the form signs in
    settings.OZ0_LOCAL_PASSWORDS = False
    settings.AUTHENTICATION_BACKENDS = [b for b in BACKENDS if not b.endswith("ModelBackend")]
    refused = Client().post("/login/", form)
    assert refused.status_code == 403 and "Passwords are turned off here" in refused.content.decode()
    assert authenticate(None, username=user.username, password="a-local-password-1") is None
    admin = Client().post("/admin/login/", form)
    assert admin.status_code == 200 and "_auth_user_id" not in admin.client.session  # type: ignore[attr-defined]
    page = Client().get("/login/").content.decode()
    assert "Sign in with Example IdP" in page and 'name="password"' not in page
    sign_in(Client(), "alice")  # the provider still signs people in


def test_without_a_provider_the_sign_in_page_offers_none_and_its_routes_are_404(db: Any) -> None:
    page = Client().get("/login/").content.decode()
    assert "Sign in with" not in page and 'name="password"' in page
    assert Client().get("/oidc/authenticate/").status_code == 404
    assert Client().get("/oidc/callback/?code=x&state=y").status_code == 404


def test_the_login_page_links_the_provider_and_says_when_a_sign_in_failed(sso: Team) -> None:
    page = Client().get("/login/?next=/w/x/&sso=failed").content.decode()
    assert "Sign in with Example IdP" in page and "/oidc/authenticate/?next=/w/x/" in page
    assert "did not complete" in page


@pytest.mark.parametrize(
    "mapping",
    ["ops", "ops=acme", "ops=acme:admin", "=acme:operator", "ops=:viewer", "ops=acme:operator,,x=y"],
)
def test_a_malformed_group_mapping_stops_the_process_with_the_entry_named(mapping: str, settings: Any) -> None:
    settings.OZ0_OIDC_GROUP_ROLES = mapping
    with pytest.raises(ImproperlyConfigured, match="OZ0_OIDC_GROUP_ROLES"):
        parse_group_roles(mapping)
    settings.OIDC_RP_CLIENT_SECRET = "s"
    for name in ("OIDC_OP_AUTHORIZATION_ENDPOINT", "OIDC_OP_TOKEN_ENDPOINT", "OIDC_OP_USER_ENDPOINT", "OIDC_OP_JWKS_ENDPOINT"):
        setattr(settings, name, "https://idp.example.test/x")
    with pytest.raises(ImproperlyConfigured, match="OZ0_OIDC_GROUP_ROLES"):
        check_configuration()


def test_a_provider_without_every_endpoint_is_refused_at_start(settings: Any) -> None:
    settings.OIDC_RP_CLIENT_SECRET = ""
    settings.OIDC_OP_JWKS_ENDPOINT = ""
    with pytest.raises(ImproperlyConfigured, match="OZ0_OIDC_CLIENT_SECRET, .*OZ0_OIDC_JWKS_ENDPOINT"):
        check_configuration()
    assert parse_group_roles(" ops = acme:operator , qa=acme:viewer ")[0].group == "ops"


@pytest.mark.parametrize("next_url", ["https://evil.example/steal", "//evil.example/", "/\\evil.example"])
def test_a_next_address_off_this_site_is_never_where_a_sign_in_lands(sso: Team, next_url: str) -> None:
    client = Client()
    started = client.get("/oidc/authenticate/", {"next": next_url})
    back = provider_redirect_back(started["Location"], "alice")
    answer = client.get(path_of(back))
    assert answer.status_code == 302 and answer["Location"] == "/" and signed_in_user(client) is not None


def test_a_next_address_on_this_site_is_where_a_sign_in_lands(sso: Team) -> None:
    client = Client()
    started = client.get("/oidc/authenticate/", {"next": f"/w/{sso.slug}/runs/"})
    answer = client.get(path_of(provider_redirect_back(started["Location"], "alice")))
    assert answer["Location"] == f"/w/{sso.slug}/runs/"
