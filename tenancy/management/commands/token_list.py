"""`./oz0 token list USER`: a person's API tokens (id, hint, label, dates, status), newest first."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from tenancy import tokens


def _when(moment: Any) -> str:
    return moment.strftime("%Y-%m-%d %H:%M") if moment else "-"


class Command(BaseCommand):
    help = "List USER's API tokens: id, hint (the token's first characters), label, created, last used, expires, status."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")

    def handle(self, *args: Any, **options: Any) -> None:
        user = User.objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"no such user: {options['username']}")
        now = timezone.now()
        rows = [("id", "hint", "label", "created", "last used", "expires", "status")]
        for row in tokens.tokens_of(user):
            rows.append(
                (
                    str(row.pk),
                    f"{row.hint}…" if row.hint else "-",
                    row.label or "-",
                    _when(row.created_at),
                    _when(row.last_used_at),
                    _when(row.expires_at) if row.expires_at else "never",
                    tokens.status_of(row, now),
                )
            )
        if len(rows) == 1:
            self.stdout.write(f"{user.username} has no API tokens")
            return
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            self.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(r, widths, strict=True)).rstrip())
