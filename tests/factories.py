"""Small keyword-only helpers that make the rows tests need."""

from __future__ import annotations

import secrets
import uuid

from django.contrib.auth.models import User

from tenancy.models import ApiToken, Membership, Workspace
from tenancy.tokens import token_digest


def unique(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def make_workspace(*, slug: str | None = None) -> Workspace:
    return Workspace.objects.create(slug=slug or unique("ws"), name="Test workspace")


def make_user(*, username: str | None = None, password: str = "pw-for-tests-only") -> User:
    return User.objects.create_user(username=username or unique("user"), password=password)


def make_member(*, workspace: Workspace, role: str, username: str | None = None) -> User:
    user = make_user(username=username)
    Membership.objects.create(workspace=workspace, user=user, role=role)
    return user


def make_token(*, user: User) -> str:
    token = secrets.token_urlsafe(32)
    ApiToken.objects.create(user=user, digest=token_digest(token), label="test")
    return token
