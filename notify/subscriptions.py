"""Subscriptions: made, listed and deleted by their owner; inputs checked before anything is written.

A webhook URL is http or https, without credentials in it. Private addresses (loopback, RFC 1918,
link-local such as a cloud's metadata endpoint) are refused unless OZ0_NOTIFY_PRIVATE_WEBHOOKS is
set: a webhook is a request our workers make on a member's behalf, and by default a member must not
be able to aim it inside the deployment's network. An install whose chat server sits on its own
network turns the setting on. The check is made here for literal addresses and names, and again
at send time on every address the name resolves to (notify/delivery.py), which then connects to
the address it vetted. An IPv6 address that embeds an IPv4 one is judged by the IPv4 it reaches.
"""

from __future__ import annotations

import ipaddress
import secrets
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from notify.models import WAIT_KINDS, Subscription
from runs.kernel import Conflict, InvalidRequest, NotFound, whole_number
from runs.selectors import workspace_for

INTERVAL_MIN = 300
INTERVAL_MAX = 7 * 24 * 3600
AGENT_MAX = 100
URL_MAX = 2000
# Subscriptions one person may hold: plenty for every workspace and channel, bounded for the sweep.
PER_USER_MAX = 50
FIELDS = ("workspace", "kinds", "agent", "email", "webhook_url", "interval_seconds")


def private_webhooks_allowed() -> bool:
    return bool(getattr(settings, "OZ0_NOTIFY_PRIVATE_WEBHOOKS", False))


# IPv6 prefixes whose low 32 bits carry an IPv4 address a host or gateway will reach: IPv4-mapped
# (::ffff:0:0/96), IPv4-translated (::ffff:0:0:0/96, RFC 2765), the deprecated IPv4-compatible
# (::/96) and NAT64's well-known prefix (64:ff9b::/96, RFC 6052). Python calls most of them global.
EMBEDDING_PREFIXES = tuple(
    ipaddress.IPv6Network(prefix) for prefix in ("::ffff:0:0/96", "::ffff:0:0:0/96", "::/96", "64:ff9b::/96")
)
# NAT64 for local use (RFC 8215): the gateway is the deployment's own, its targets its own choice.
LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, translated, compatible, NAT64, 6to4), if any."""
    if ip.sixtofour is not None:  # 2002::/16 carries it in bits 16-48
        return ip.sixtofour
    if any(ip in prefix for prefix in EMBEDDING_PREFIXES):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def is_private_address(address: str) -> bool:
    """True for any address that is not globally routable (loopback, private, link-local, ...).

    An IPv6 address that embeds an IPv4 one (`[::127.0.0.1]`, `[64:ff9b::a00:1]`, `[2002:7f00:1::]`)
    is judged by the IPv4 address it reaches.
    """
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in LOCAL_NAT64 or ip.teredo is not None:
            return True
        ip = embedded_ipv4(ip) or ip
    return not ip.is_global or ip.is_multicast


def checked_webhook_url(value: Any) -> str:
    if value is None or value == "":
        return ""
    if not isinstance(value, str) or len(value) > URL_MAX:
        raise InvalidRequest("invalid_webhook_url", f"webhook_url is a URL of at most {URL_MAX} characters")
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise InvalidRequest("invalid_webhook_url", "webhook_url holds spaces or control characters")
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        raise InvalidRequest("invalid_webhook_url", "webhook_url is not a URL") from None
    if parts.scheme not in ("http", "https"):
        raise InvalidRequest("invalid_webhook_url", "webhook_url must start with http:// or https://")
    host = parts.hostname or ""
    if not host:
        raise InvalidRequest("invalid_webhook_url", "webhook_url names no host")
    if parts.username is not None or parts.password is not None:
        raise InvalidRequest("invalid_webhook_url", "webhook_url must not carry a user or password")
    if port == 0:
        raise InvalidRequest("invalid_webhook_url", "webhook_url's port is not a port")
    if not private_webhooks_allowed() and _names_private_host(host):
        raise InvalidRequest(
            "private_webhook_url", "webhook_url points at a private or local address (set OZ0_NOTIFY_PRIVATE_WEBHOOKS to allow)"
        )
    return value


def _names_private_host(host: str) -> bool:
    try:
        return is_private_address(host)
    except ValueError:
        pass
    name = host.lower().rstrip(".")
    return name == "localhost" or name.endswith((".localhost", ".local", ".internal")) or "." not in name


def _has_control(text: str) -> bool:
    # A form post is not parsed by the API's strict JSON parser: NUL and control characters stop here.
    return any(ord(ch) < 32 or ord(ch) == 127 for ch in text)


def _checked_kinds(value: Any) -> list[str]:
    if not isinstance(value, list) or not value or len(value) > len(WAIT_KINDS):
        raise InvalidRequest("invalid_kinds", f"kinds is a non-empty list of {', '.join(WAIT_KINDS)}")
    if any(not isinstance(kind, str) or kind not in WAIT_KINDS for kind in value) or len(set(value)) != len(value):
        raise InvalidRequest("invalid_kinds", f"kinds is a list of distinct kinds from {', '.join(WAIT_KINDS)}")
    return [kind for kind in WAIT_KINDS if kind in value]


def _checked_interval(value: Any) -> int:
    if value is None:
        return 900
    number = whole_number(value)
    if number is None or not INTERVAL_MIN <= number <= INTERVAL_MAX:
        raise InvalidRequest(
            "invalid_interval", f"interval_seconds is a whole number from {INTERVAL_MIN} to {INTERVAL_MAX} (a week)"
        )
    return number


def create(user: Any, body: Any) -> tuple[Subscription, str]:
    """A new subscription of `user`: (its row, the webhook secret, shown once; empty without a webhook)."""
    if not isinstance(body, dict):
        raise InvalidRequest("invalid_request", "the body must be a JSON object")
    unknown = set(body) - set(FIELDS)
    if unknown:
        raise InvalidRequest("unknown_field", f"unknown field(s): {', '.join(sorted(map(str, unknown)))}")
    slug = body.get("workspace")
    if not isinstance(slug, str) or not slug or len(slug) > 64 or _has_control(slug):
        raise InvalidRequest("invalid_workspace", "workspace is a workspace's slug")
    kinds = _checked_kinds(body.get("kinds"))
    agent = body.get("agent") or ""
    if not isinstance(agent, str) or len(agent) > AGENT_MAX or _has_control(agent):
        raise InvalidRequest("invalid_agent", f"agent is an agent's name of at most {AGENT_MAX} characters")
    email = body.get("email", False)
    if not isinstance(email, bool):
        raise InvalidRequest("invalid_email", "email is true or false")
    webhook_url = checked_webhook_url(body.get("webhook_url"))
    interval = _checked_interval(body.get("interval_seconds"))
    if not email and not webhook_url:
        raise InvalidRequest("no_channel", "choose e-mail, a webhook_url, or both")
    if email and not getattr(user, "email", ""):
        raise InvalidRequest("no_email_address", "your account has no e-mail address to send to")
    workspace = workspace_for(user, slug)
    secret = secrets.token_urlsafe(32) if webhook_url else ""
    with transaction.atomic():
        # Serialize one person's creations so the cap holds under concurrent requests.
        get_user_model().objects.select_for_update().filter(pk=user.pk).first()
        if Subscription.objects.filter(user_id=user.pk).count() >= PER_USER_MAX:
            raise Conflict("too_many_subscriptions", f"you hold {PER_USER_MAX} subscriptions; delete one first")
        row = Subscription.objects.create(
            user=user,
            workspace=workspace,
            kinds=kinds,
            agent=agent.strip(),
            email=email,
            webhook_url=webhook_url,
            secret=secret,
            interval_seconds=interval,
            # Waits that began before the subscription are not news to it.
            watermark=timezone.now(),
        )
    return row, secret


def subscriptions_of(user: Any, workspace: str | None = None) -> QuerySet[Subscription]:
    rows = Subscription.objects.filter(user_id=user.pk).select_related("workspace")
    if workspace:
        rows = rows.filter(workspace__slug=workspace)
    return rows.order_by("-created_at", "-pk")


def delete(user: Any, subscription_id: int) -> None:
    deleted, _ = Subscription.objects.filter(pk=subscription_id, user_id=user.pk).delete()
    if not deleted:
        raise NotFound("subscription")


def masked_url(url: str) -> str:
    """An incoming-webhook URL is itself a credential (Slack's path is the key): show its host only."""
    if not url:
        return ""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/…"


def status_of(row: Subscription) -> str:
    if row.consecutive_failures:
        return "failing"
    if row.last_digest_at is None:
        return "no digest yet"
    return "ok"


def document(row: Subscription, *, secret: str = "") -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": row.pk,
        "workspace": row.workspace.slug,
        "kinds": list(row.kinds),
        "agent": row.agent or None,
        "email": row.email,
        "webhook": masked_url(row.webhook_url) or None,
        "interval_seconds": row.interval_seconds,
        "created_at": row.created_at.isoformat(),
        "status": status_of(row),
        "last_digest_at": row.last_digest_at.isoformat() if row.last_digest_at else None,
        "last_attempt_at": row.last_attempt_at.isoformat() if row.last_attempt_at else None,
        "last_error": row.last_error or None,
        "consecutive_failures": row.consecutive_failures,
        "digests_sent": row.digests_sent,
        "next_digest_after": (row.last_digest_at + timedelta(seconds=row.interval_seconds)).isoformat()
        if row.last_digest_at
        else None,
    }
    if secret:
        doc["secret"] = secret
    return doc
