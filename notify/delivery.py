"""The two channels: e-mail through Django's mail backend, and a signed Slack-compatible webhook.

A webhook body is `{"text": ...}` (what Slack, Mattermost and Rocket.Chat incoming webhooks take),
sent with `X-Oz0-Signature: sha256=<hex>`, the HMAC-SHA256 of the exact body bytes under the
subscription's secret, so a receiver can tell our digests from anyone else's POST. Redirects are
not followed (a redirect could lead past the private-address check), the host's name is resolved
once and the request sent to the address that was vetted (no second look-up a rebinding name could
answer differently), and the answer's body is never
read into an error: a failure records the status or the exception's class only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import smtplib
import socket
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from django.core.mail import send_mail

from notify.subscriptions import is_private_address, private_webhooks_allowed
from oz0site.metering import meter

SIGNATURE_HEADER = "X-Oz0-Signature"
WEBHOOK_TIMEOUT_SECONDS = 10.0


class DeliveryError(Exception):
    """A channel refused or could not be reached; the message is safe to show its owner."""


def signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def send_email(address: str, subject: str, text: str) -> None:
    if not address:
        raise DeliveryError("e-mail: your account has no e-mail address")
    try:
        send_mail(subject, text, None, [address], fail_silently=False)
    except (smtplib.SMTPException, OSError) as error:
        raise DeliveryError(f"e-mail: {type(error).__name__}") from None


def vetted_address(url: str) -> str:
    """The one address the webhook's host resolves to that the send will connect to.

    The name is resolved once, here: every address it gives must be public (unless private webhooks
    are allowed), and the request then goes to the first of them, so a name that answers a public
    address now and a private one a moment later (DNS rebinding) cannot steer the connection.
    """
    parts = urlsplit(url)
    try:
        infos = socket.getaddrinfo(
            parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80), type=socket.SOCK_STREAM
        )
    except OSError:
        raise DeliveryError("webhook: the host does not resolve") from None
    addresses = [str(info[4][0]) for info in infos]
    if not addresses:
        raise DeliveryError("webhook: the host does not resolve")
    if not private_webhooks_allowed() and any(is_private_address(address) for address in addresses):
        raise DeliveryError("webhook: the host resolves to a private address (refused)")
    return addresses[0]


def pinned_request(url: str, address: str) -> tuple[str, dict[str, str], dict[str, Any]]:
    """(the URL aimed at `address`, the Host header, the request's extensions keeping the TLS name).

    The connection goes to the vetted address; the server still sees the name in Host, and TLS
    sends it as SNI and checks the certificate against it.
    """
    parts = urlsplit(url)
    literal = f"[{address}]" if ":" in address else address
    netloc = literal + (f":{parts.port}" if parts.port else "")
    extensions: dict[str, Any] = {"sni_hostname": parts.hostname} if parts.scheme == "https" else {}
    return urlunsplit(parts._replace(netloc=netloc)), {"Host": parts.netloc.rsplit("@", 1)[-1]}, extensions


def _transport() -> httpx.BaseTransport | None:
    """The HTTP transport (None: httpx's own); tests put a recording one here."""
    return None


def post_webhook(url: str, secret: str, text: str) -> None:
    try:
        _post_webhook(url, secret, text)
    except DeliveryError:
        meter.count("oz0_webhook_failures_total")
        raise


def _post_webhook(url: str, secret: str, text: str) -> None:
    target, host, extensions = pinned_request(url, vetted_address(url))
    body = json.dumps({"text": text}, ensure_ascii=False).encode()
    headers = {
        **host,
        "Content-Type": "application/json",
        SIGNATURE_HEADER: signature(secret, body),
        "User-Agent": "oz0-notify",
    }
    try:
        # No proxy from the environment: the request goes to the address that was vetted.
        with httpx.Client(
            transport=_transport(), timeout=WEBHOOK_TIMEOUT_SECONDS, follow_redirects=False, trust_env=False
        ) as client:
            response = client.post(target, content=body, headers=headers, extensions=extensions)
    except httpx.HTTPError as error:
        raise DeliveryError(f"webhook: {type(error).__name__}") from None
    if not 200 <= response.status_code < 300:
        raise DeliveryError(f"webhook: answered HTTP {response.status_code}")
