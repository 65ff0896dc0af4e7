"""`./oz0 token create USER --workspace WS --role ROLE`: a bearer token for scripts and tests.

Creates the user and the workspace when missing and sets the member's role; prints the
token on its last line. Only its sha256 digest is stored.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.validators import validate_slug
from django.db import transaction

from oz0site.api import token_digest
from runs.models import ApiToken, Membership, Role, Workspace


def issue_token(*, username: str, workspace_slug: str, role: str, label: str = "cli") -> tuple[str, bool, bool]:
    """Returns (token, user created, workspace created)."""
    with transaction.atomic():
        user, user_created = User.objects.get_or_create(username=username)
        if user_created:
            user.set_unusable_password()
            user.save(update_fields=["password"])
        workspace, workspace_created = Workspace.objects.get_or_create(slug=workspace_slug, defaults={"name": workspace_slug})
        Membership.objects.update_or_create(workspace=workspace, user=user, defaults={"role": role})
        token = secrets.token_urlsafe(32)
        ApiToken.objects.create(user=user, digest=token_digest(token), label=label)
    return token, user_created, workspace_created


class Command(BaseCommand):
    help = "Create a bearer token for USER in a workspace with a role (creates both when missing)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--workspace", required=True, help="the workspace's slug")
        parser.add_argument("--role", required=True, choices=[r.value for r in Role])
        parser.add_argument("--label", default="cli", help="a note kept with the token")

    def handle(self, *args: Any, **options: Any) -> None:
        username = options["username"].strip()
        if not username or len(username) > 150:
            raise CommandError("USER must be 1 to 150 characters")
        try:
            validate_slug(options["workspace"])
        except Exception:
            raise CommandError(f"--workspace {options['workspace']!r} must be a slug (letters, digits, - and _)") from None
        token, user_created, workspace_created = issue_token(
            username=username, workspace_slug=options["workspace"], role=options["role"], label=options["label"][:100]
        )
        notes = [f"user {username}" + (" (created)" if user_created else "")]
        notes.append(f"workspace {options['workspace']}" + (" (created)" if workspace_created else ""))
        notes.append(f"role {options['role']}")
        self.stdout.write(", ".join(notes))
        self.stdout.write(token)
