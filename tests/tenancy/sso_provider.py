"""The test provider (tests/oidc_provider) started for a test module, and the code flow walked
against it over HTTP as a browser would: oz0's redirect, the provider's sign-in form, its
redirect back with a code."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

ROOT = Path(__file__).resolve().parents[2]
CLIENT_ID = "oz0-console"
CLIENT_SECRET = "s3cret-of-the-oz0-client-" + "y" * 20
PASSWORD = "provider-password-1"
PEOPLE = {
    "alice": ["oz0-ops"],
    "bob": ["oz0-readers", "oz0-viewers"],
    "carol": ["payroll"],
    "erin": ["oz0-viewers"],
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Provider:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def issuer(self) -> str:
        return f"{self.url}/openid"

    def settings(self) -> dict[str, Any]:
        return {
            "OZ0_SSO": True,
            "OIDC_RP_CLIENT_ID": CLIENT_ID,
            "OIDC_RP_CLIENT_SECRET": CLIENT_SECRET,
            "OIDC_OP_AUTHORIZATION_ENDPOINT": f"{self.issuer}/authorize",
            "OIDC_OP_TOKEN_ENDPOINT": f"{self.issuer}/token",
            "OIDC_OP_USER_ENDPOINT": f"{self.issuer}/userinfo",
            "OIDC_OP_JWKS_ENDPOINT": f"{self.issuer}/jwks",
            "OZ0_OIDC_ISSUER": self.issuer,
            "OZ0_OIDC_PROVIDER_NAME": "Example IdP",
        }


def start_provider(redirect_uri: str) -> Provider:
    workdir = Path(tempfile.mkdtemp(prefix="oz0-idp-"))
    port = free_port()
    setup = {
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
        "redirect_uri": redirect_uri,
        "people": [
            {"username": name, "password": PASSWORD, "email": f"{name}@example.test", "groups": groups}
            for name, groups in PEOPLE.items()
        ],
    }
    (workdir / "setup.json").write_text(json.dumps(setup))
    log = workdir / "provider.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.oidc_provider.serve", str(port), str(workdir / "idp.sqlite3"), str(workdir / "setup.json")],
        cwd=ROOT,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    provider = Provider(f"http://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("the test provider exited:\n" + log.read_text(errors="replace")[-3000:])
        try:
            if httpx.get(f"{provider.issuer}/.well-known/openid-configuration", timeout=2).status_code == 200:
                return provider
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError("the test provider did not answer in 120 s:\n" + log.read_text(errors="replace")[-3000:])


def provider_redirect_back(authorize_url: str, username: str, password: str = PASSWORD) -> str:
    """A person at the provider: its sign-in form, then its redirect back to oz0 (the URL with the code)."""
    with httpx.Client(follow_redirects=False, timeout=30) as browser:
        answer = browser.get(authorize_url)
        if answer.status_code == 302 and "/accounts/login/" in answer.headers["location"]:
            login_url = httpx.URL(authorize_url).join(answer.headers["location"])
            form = browser.get(login_url)
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
            assert token is not None, form.text[:500]
            signed_in = browser.post(
                login_url,
                data={
                    "csrfmiddlewaretoken": token.group(1),
                    "username": username,
                    "password": password,
                    "next": dict(httpx.URL(str(login_url)).params).get("next", ""),
                },
            )
            assert signed_in.status_code == 302, f"the provider refused {username}: {signed_in.text[:300]}"
            answer = browser.get(httpx.URL(str(login_url)).join(signed_in.headers["location"]))
        assert answer.status_code == 302, answer.text[:500]
        return str(answer.headers["location"])


def path_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}" if parts.query else parts.path
