"""Single sign-on: people sign in through the installer's OpenID Connect provider.

mozilla-django-oidc runs the code flow (state, nonce, PKCE, the ID token's signature checked
against the provider's keys); this module decides who the signed-in subject is in oz0 and which
workspaces they belong to:

- The subject is found by the issuer's `sub` (`SsoIdentity`), never by email: an account at the
  provider that claims someone's address does not take over their local account. A new subject
  gets a new user, named after its `preferred_username` when that name is free.
- The groups claim (`OZ0_OIDC_GROUPS_CLAIM`) sets the person's role in each workspace the
  installer's mapping names (`OZ0_OIDC_GROUP_ROLES`, `group=workspace:role`, comma-separated),
  at every sign-in: the highest role of the groups they are in, or no membership when none of
  them maps to that workspace. Workspaces the mapping does not name are left as their operators
  keep them.

Every address the server connects to is a setting; nothing a person sends names one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.utils import timezone
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from tenancy.models import Membership, Role, SsoIdentity, Workspace

log = logging.getLogger(__name__)

ROLE_RANK = {Role.VIEWER: 0, Role.READER: 1, Role.OPERATOR: 2}
USERNAME_MAX = 150


@dataclass(frozen=True)
class GroupRole:
    group: str
    workspace: str
    role: str


def parse_group_roles(text: str) -> list[GroupRole]:
    """`ops=acme:operator, analysts=acme:reader` as rules; a malformed entry is the installer's
    error, refused when the process starts (never a person silently given no role)."""
    rules = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        group, equals, target = entry.rpartition("=")
        workspace, colon, role = target.partition(":")
        if not equals or not colon or not group.strip() or not workspace.strip() or role.strip() not in ROLE_RANK:
            raise ImproperlyConfigured(
                f"OZ0_OIDC_GROUP_ROLES: {entry!r} is not group=workspace:role (role one of viewer, reader, operator)"
            )
        rules.append(GroupRole(group.strip(), workspace.strip(), role.strip()))
    return rules


REQUIRED_SETTINGS = {
    "OIDC_RP_CLIENT_SECRET": "OZ0_OIDC_CLIENT_SECRET",
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "OZ0_OIDC_AUTHORIZATION_ENDPOINT",
    "OIDC_OP_TOKEN_ENDPOINT": "OZ0_OIDC_TOKEN_ENDPOINT",
    "OIDC_OP_USER_ENDPOINT": "OZ0_OIDC_USERINFO_ENDPOINT",
    "OIDC_OP_JWKS_ENDPOINT": "OZ0_OIDC_JWKS_ENDPOINT",
}


def check_configuration() -> None:
    """With a client id set, every endpoint and the mapping must be whole."""
    missing = [variable for name, variable in REQUIRED_SETTINGS.items() if not getattr(settings, name, "")]
    if missing:
        raise ImproperlyConfigured(f"single sign-on (OZ0_OIDC_CLIENT_ID) also needs {', '.join(missing)}")
    parse_group_roles(settings.OZ0_OIDC_GROUP_ROLES)


def groups_of(claims: dict[str, Any]) -> set[str]:
    """The groups claim as a set of names: a list of strings, or one string; anything else is none."""
    value = claims.get(settings.OZ0_OIDC_GROUPS_CLAIM)
    if isinstance(value, str):
        return {value}
    if isinstance(value, list):
        return {item for item in value if isinstance(item, str)}
    return set()


def sync_roles(user: Any, claims: dict[str, Any]) -> dict[str, str | None]:
    """Set the person's role in every mapped workspace from their groups; what each became."""
    groups = groups_of(claims)
    wanted: dict[str, str | None] = {}
    for rule in parse_group_roles(settings.OZ0_OIDC_GROUP_ROLES):
        current = wanted.get(rule.workspace)
        if rule.group in groups and (current is None or ROLE_RANK[Role(rule.role)] > ROLE_RANK[Role(current)]):
            wanted[rule.workspace] = rule.role
        else:
            wanted.setdefault(rule.workspace, None)
    workspaces = {w.slug: w for w in Workspace.objects.filter(slug__in=list(wanted))}
    for slug, role in wanted.items():
        workspace = workspaces.get(slug)
        if workspace is None:
            log.warning("OZ0_OIDC_GROUP_ROLES names workspace %r, which does not exist", slug)
            continue
        if role is None:
            Membership.objects.filter(user=user, workspace=workspace).delete()
            continue
        existing = Membership.objects.filter(user=user, workspace=workspace).first()
        if existing is None:
            Membership.objects.create(user=user, workspace=workspace, role=role)
        elif existing.role != role:
            existing.role = role
            existing.save(update_fields=["role"])
    return wanted


def _free_username(claims: dict[str, Any], subject: str) -> str:
    model = get_user_model()
    wanted = str(claims.get("preferred_username") or "").strip()[:USERNAME_MAX]
    if wanted and not model.objects.filter(username__iexact=wanted).exists():
        return wanted
    base = f"sso-{subject}"[: USERNAME_MAX - 8]
    name, counter = base, 1
    while model.objects.filter(username__iexact=name).exists():
        counter += 1
        name = f"{base}-{counter}"
    return name


class SsoBackend(OIDCAuthenticationBackend):
    """The code flow's last step: the verified ID token and the userinfo claims to an oz0 user."""

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        return isinstance(claims.get("sub"), str) and bool(claims["sub"])

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]) -> Any:
        claims = {**payload, **self.get_userinfo(access_token, id_token, payload)}
        if not self.verify_claims(claims) or claims["sub"] != payload.get("sub"):
            raise SuspiciousOperation("the provider's userinfo names another subject than its ID token")
        issuer = str(payload.get("iss") or "")
        if settings.OZ0_OIDC_ISSUER and issuer != settings.OZ0_OIDC_ISSUER:
            raise SuspiciousOperation(f"an ID token from issuer {issuer!r}, not the configured one")
        with transaction.atomic():
            identity = SsoIdentity.objects.select_related("user").filter(issuer=issuer, subject=claims["sub"]).first()
            if identity is None:
                model = get_user_model()
                user = model.objects.create_user(
                    _free_username(claims, claims["sub"]), email=str(claims.get("email") or "")[:254]
                )
                user.set_unusable_password()  # signs in through the provider only
                user.save(update_fields=["password"])
                identity = SsoIdentity.objects.create(user=user, issuer=issuer, subject=claims["sub"])
            user = identity.user
            if not user.is_active:
                return None
            identity.last_signed_in_at = timezone.now()
            identity.save(update_fields=["last_signed_in_at"])
            sync_roles(user, claims)
        return user


class SignInView(OIDCAuthenticationRequestView):
    """`/oidc/authenticate/`: off (404) unless the installer configured a provider."""

    def get(self, request: HttpRequest) -> HttpResponse:
        if not settings.OZ0_SSO:
            raise Http404("single sign-on is not configured")
        return super().get(request)


class CallbackView(OIDCAuthenticationCallbackView):
    """`/oidc/callback/`: the provider's redirect back, with its code and the state."""

    def get(self, request: HttpRequest) -> HttpResponse:
        if not settings.OZ0_SSO:
            raise Http404("single sign-on is not configured")
        return super().get(request)
