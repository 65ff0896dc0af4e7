"""The two channels: e-mail through Django's mail backend, and a signed Slack-compatible webhook.

A webhook body is `{"text": ...}` (what Slack, Mattermost and Rocket.Chat incoming webhooks take),
sent with `X-Oz0-Signature: sha256=<hex>`, the HMAC-SHA256 of the exact body bytes under the
subscription's secret, so a receiver can tell our digests from anyone else's POST. Redirects are
not followed (a redirect could lead past the private-address check) and the answer's body is never
read into an error: a failure records the status or the exception's class only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import smtplib
import socket
from urllib.parse import urlsplit

import httpx
from django.core.mail import send_mail

from notify.subscriptions import is_private_address, private_webhooks_allowed

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


def _check_resolved_host(url: str) -> None:
    """Every address the host resolves to must be public, unless private webhooks are allowed."""
    if private_webhooks_allowed():
        return
    parts = urlsplit(url)
    try:
        infos = socket.getaddrinfo(parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))
    except OSError:
        raise DeliveryError("webhook: the host does not resolve") from None
    if any(is_private_address(str(info[4][0])) for info in infos):
        raise DeliveryError("webhook: the host resolves to a private address (refused)")


def post_webhook(url: str, secret: str, text: str) -> None:
    _check_resolved_host(url)
    body = json.dumps({"text": text}, ensure_ascii=False).encode()
    headers = {"Content-Type": "application/json", SIGNATURE_HEADER: signature(secret, body), "User-Agent": "oz0-notify"}
    try:
        response = httpx.post(url, content=body, headers=headers, timeout=WEBHOOK_TIMEOUT_SECONDS, follow_redirects=False)
    except httpx.HTTPError as error:
        raise DeliveryError(f"webhook: {type(error).__name__}") from None
    if not 200 <= response.status_code < 300:
        raise DeliveryError(f"webhook: answered HTTP {response.status_code}")
