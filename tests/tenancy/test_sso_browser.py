"""Single sign-on in a browser: oz0 served by daphne with a provider configured as an installer
would (environment variables), the test provider on loopback, headless Chromium through both."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from tenancy.models import Membership, SsoIdentity
from tests.browser import SCREENSHOTS, ConsoleServer, daphne
from tests.conftest import LiveStack
from tests.factories import make_workspace
from tests.tenancy.sso_provider import PASSWORD, Provider, free_port, start_provider

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def sso_site(live_stack: LiveStack, django_db_blocker: Any) -> Iterator[tuple[ConsoleServer, Provider, str]]:
    port = free_port()
    provider = start_provider(f"http://127.0.0.1:{port}/oidc/callback/")
    with django_db_blocker.unblock():
        slug = make_workspace().slug
    env = {
        **live_stack.env,
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DEBUG": "1",
        "OZ0_OIDC_CLIENT_ID": provider.settings()["OIDC_RP_CLIENT_ID"],
        "OZ0_OIDC_CLIENT_SECRET": provider.settings()["OIDC_RP_CLIENT_SECRET"],
        "OZ0_OIDC_AUTHORIZATION_ENDPOINT": f"{provider.issuer}/authorize",
        "OZ0_OIDC_TOKEN_ENDPOINT": f"{provider.issuer}/token",
        "OZ0_OIDC_USERINFO_ENDPOINT": f"{provider.issuer}/userinfo",
        "OZ0_OIDC_JWKS_ENDPOINT": f"{provider.issuer}/jwks",
        "OZ0_OIDC_ISSUER": provider.issuer,
        "OZ0_OIDC_PROVIDER_NAME": "Example IdP",
        "OZ0_OIDC_GROUP_ROLES": f"oz0-ops={slug}:operator,oz0-viewers={slug}:viewer",
        "OZ0_LOCAL_PASSWORDS": "0",
    }
    # Started with the provider (its callback names this port); a slow first start is given time.
    try:
        with daphne(env, live_stack.workdir / "daphne-sso.log", port, start_seconds=120) as server:
            yield server, provider, slug
    finally:
        os.killpg(provider.process.pid, signal.SIGKILL)
        provider.process.wait(timeout=10)


def test_a_person_signs_in_through_the_provider_and_lands_where_they_were_going(
    sso_site: tuple[ConsoleServer, Provider, str],
    chromium: Any,
    django_db_blocker: Any,
) -> None:
    server, _, slug = sso_site
    context = chromium.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    try:
        page.goto(f"{server.url}/w/{slug}/runs/")  # signed out: to the sign-in page, keeping where to
        expect(page.get_by_role("link", name="Sign in with Example IdP")).to_be_visible()
        expect(page.locator("input[name=password]")).to_have_count(0)  # passwords are off here
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "sso-sign-in.png"), full_page=True)
        page.get_by_role("link", name="Sign in with Example IdP").click()
        page.fill("#provider-username", "alice")
        page.fill("#provider-password", PASSWORD)
        page.get_by_role("button", name="Sign in at the provider").click()
        page.wait_for_url(f"{server.url}/w/{slug}/runs/", timeout=30_000)
        expect(page.locator("body")).to_contain_text("Runs")
        with django_db_blocker.unblock():
            identity = SsoIdentity.objects.select_related("user").get(
                user__username="alice", issuer__startswith="http://127.0.0.1"
            )
            assert Membership.objects.get(user=identity.user, workspace__slug=slug).role == "operator"
    finally:
        context.close()
