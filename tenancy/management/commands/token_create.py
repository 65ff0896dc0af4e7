"""`./oz0 token create USER --workspace WS --role ROLE [--expires-in DAYS]`: a bearer token for scripts and tests.

Creates the user and the workspace when missing and sets the member's role; prints the
token on its last line. Only its sha256 digest is stored. `./oz0 token list USER` and
`./oz0 token revoke ID` manage them.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.validators import validate_slug
from django.db import transaction

from tenancy import tokens
from tenancy.models import Membership, Role, Workspace


def issue_token(
    *, username: str, workspace_slug: str, role: str, label: str = "cli", expires_in_days: int | None = None
) -> tuple[str, bool, bool]:
    """Returns (token, user created, workspace created)."""
    with transaction.atomic():
        user, user_created = User.objects.get_or_create(username=username)
        if user_created:
            user.set_unusable_password()
            user.save(update_fields=["password"])
        workspace, workspace_created = Workspace.objects.get_or_create(slug=workspace_slug, defaults={"name": workspace_slug})
        Membership.objects.update_or_create(workspace=workspace, user=user, defaults={"role": role})
        token, _ = tokens.issue(user=user, label=label, expires_in_days=expires_in_days)
    return token, user_created, workspace_created


class Command(BaseCommand):
    help = "Create a bearer token for USER in a workspace with a role (creates both when missing)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--workspace", required=True, help="the workspace's slug")
        parser.add_argument("--role", required=True, choices=[r.value for r in Role])
        parser.add_argument("--label", default="cli", help="a note kept with the token")
        parser.add_argument("--expires-in", type=int, metavar="DAYS", help="the token stops working after DAYS days (1-3650)")

    def handle(self, *args: Any, **options: Any) -> None:
        username = options["username"].strip()
        if not username or len(username) > 150:
            raise CommandError("USER must be 1 to 150 characters")
        try:
            validate_slug(options["workspace"])
        except Exception:
            raise CommandError(f"--workspace {options['workspace']!r} must be a slug (letters, digits, - and _)") from None
        try:
            token, user_created, workspace_created = issue_token(
                username=username,
                workspace_slug=options["workspace"],
                role=options["role"],
                label=options["label"][:100],
                expires_in_days=options["expires_in"],
            )
        except tokens.TokenRefused as error:
            raise CommandError(error.detail) from None
        notes = [f"user {username}" + (" (created)" if user_created else "")]
        notes.append(f"workspace {options['workspace']}" + (" (created)" if workspace_created else ""))
        notes.append(f"role {options['role']}")
        self.stdout.write(", ".join(notes))
        self.stdout.write(token)
