"""Django's `migrate`, without the bound on sessions idle inside a transaction
(oz0site.config.migrating says why)."""

from __future__ import annotations

from typing import Any

from django.core.management.commands.migrate import Command as DjangoMigrate
from django.db import connections

from oz0site.config import migrating


class Command(DjangoMigrate):
    def handle(self, *args: Any, **options: Any) -> None:
        with migrating(connections[options["database"]]):
            super().handle(*args, **options)
