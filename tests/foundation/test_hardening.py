"""Settings and headers a real install relies on: the proxy header, the CSP, the API docs' assets."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from tests.foundation.helpers import manage
from tests.foundation.test_deploy import production_env

PRINT_PROXY_HEADER = "from django.conf import settings; print(settings.SECURE_PROXY_SSL_HEADER)"


def test_it_believes_x_forwarded_proto_only_behind_a_proxy() -> None:
    """Before, any client could send X-Forwarded-Proto: https and be taken for a TLS request."""
    plain = manage("shell", "-c", PRINT_PROXY_HEADER, env=production_env())
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip().splitlines()[-1] == "None"
    proxied = manage("shell", "-c", PRINT_PROXY_HEADER, env=production_env(OZ0_BEHIND_PROXY="1"))
    assert proxied.stdout.strip().splitlines()[-1] == "('HTTP_X_FORWARDED_PROTO', 'https')"


@pytest.mark.django_db
def test_it_takes_a_forged_forwarded_proto_for_plain_http(settings: Any) -> None:
    settings.SECURE_PROXY_SSL_HEADER = None
    response = Client().get("/api/v1/openapi.json", HTTP_X_FORWARDED_PROTO="https")
    assert response.wsgi_request.is_secure() is False


def _csp(response: Any) -> dict[str, str]:
    return {d.split()[0]: d for d in (part.strip() for part in response["Content-Security-Policy"].split(";")) if d}


@pytest.mark.django_db
def test_it_lets_pages_connect_only_to_their_own_origin() -> None:
    """Before, connect-src allowed `ws: wss:`: a page could open a socket to any host."""
    response = Client().get("/login/")
    assert _csp(response)["connect-src"] == "connect-src 'self'"


@pytest.mark.django_db
def test_it_serves_the_api_docs_from_this_install_under_the_csp() -> None:
    """Before, /api/v1/docs loaded Swagger UI from a CDN and went without the CSP."""
    response = Client().get("/api/v1/docs")
    assert response.status_code == 200
    html = response.content.decode()
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert assets and all(url.startswith("/static/") for url in assets), assets
    assert "cdn" not in html.lower() and "<script>" not in html.replace(" ", "")
    policy = _csp(response)
    assert policy["script-src"] == "script-src 'self'" and policy["connect-src"] == "connect-src 'self'"
    for url in assets:
        assert Client().get(url).status_code == 200, url
