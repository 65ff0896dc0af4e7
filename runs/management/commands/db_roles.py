"""`./oz0 manage db_roles`: the PostgreSQL roles of a least-privilege install (oz0site/db_roles.py).

Run once by an administrator (DATABASE_URL naming a superuser, or a role with CREATEROLE that owns
the database), then migrate as the owner role and run every process as the app role. Passwords
come from OZ0_DB_OWNER_PASSWORD and OZ0_DB_APP_PASSWORD, never the command line (which `ps` shows
to everyone); without them the roles have none (peer or trust authentication).
"""

from __future__ import annotations

import os
import re
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from oz0site.db_roles import Roles, provision

ROLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class Command(BaseCommand):
    help = "Create or update the owner role (migrations) and the app role (web, workers, beat) with the least grants."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--owner", default="oz0_owner", help="the role migrations run as (default oz0_owner)")
        parser.add_argument("--app", default="oz0_app", help="the role the processes run as (default oz0_app)")

    def handle(self, *args: Any, **options: Any) -> None:
        owner, app = options["owner"], options["app"]
        for name in (owner, app):
            if not ROLE_NAME.match(name):
                raise CommandError(f"{name!r} is not a role name oz0 makes: lower-case letters, digits and _, at most 63")
        if owner == app:
            raise CommandError("the owner and the app must be two roles: the app must not own what migrations change")
        done = provision(
            Roles(owner=owner, app=app),
            owner_password=os.environ.get("OZ0_DB_OWNER_PASSWORD") or None,
            app_password=os.environ.get("OZ0_DB_APP_PASSWORD") or None,
        )
        for line in done:
            self.stdout.write(line)
