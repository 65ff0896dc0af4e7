"""`./oz0 token revoke ID...`: revoke API tokens by the ids `./oz0 token list USER` shows."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenancy import tokens


class Command(BaseCommand):
    help = "Revoke API tokens by id (see ./oz0 token list USER); a revoked token authenticates nobody."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("ids", nargs="+", metavar="ID")

    def handle(self, *args: Any, **options: Any) -> None:
        failed = []
        for token_id in options["ids"]:
            try:
                row = tokens.revoke(token_id=token_id)
            except tokens.TokenRefused as error:
                failed.append(f"{token_id}: {error.detail}")
                continue
            self.stdout.write(f"revoked token {row.pk} ({row.label or 'no label'}) of {row.user.username}")
        if failed:
            raise CommandError("; ".join(failed))
