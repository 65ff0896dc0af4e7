"""Test databases for pytest-xdist workers, copied from one migrated template.

Each xdist worker would otherwise migrate its own test database from nothing: four workers
running every migration at once on two cores, before any test starts. Instead the first worker
to arrive migrates a template once per set of migrations (its name carries their digest), and
every worker copies it with PostgreSQL's `CREATE DATABASE … TEMPLATE`, a file copy that takes a
fraction of a second. The template stays for the next run with the same migrations; a template
of other migrations is dropped when a new one is built."""

from __future__ import annotations

import fcntl
import hashlib
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import django
from django.conf import settings
from django.db.backends.base.creation import BaseDatabaseCreation

ROOT = Path(__file__).resolve().parent.parent
WORKER_SUFFIX = re.compile(r"_gw\d+$")


def migrations_digest() -> str:
    """What a migrated database depends on: the migrations, the installed apps (the test tools'
    app is installed only with OZ0_TEST_TOOLS=1) and Django's own version."""
    digest = hashlib.sha256()
    digest.update(django.__version__.encode())
    digest.update("\n".join(settings.INSTALLED_APPS).encode())
    for path in sorted(ROOT.glob("*/migrations/*.py")):
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def template_name(test_database: str) -> str:
    return f"{WORKER_SUFFIX.sub('', test_database)}_tpl_{migrations_digest()}"


@contextmanager
def held_lock(name: str) -> Iterator[None]:
    with open(Path(tempfile.gettempdir()) / f"oz0-{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _databases_like(creation: BaseDatabaseCreation, pattern: str) -> list[str]:
    with creation._nodb_cursor() as cursor:  # type: ignore[attr-defined]
        cursor.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", [pattern])
        return [row[0] for row in cursor.fetchall()]


def _execute_without_database(creation: BaseDatabaseCreation, statement: str) -> None:
    with creation._nodb_cursor() as cursor:  # type: ignore[attr-defined]
        cursor.execute(statement)


def _build_template(creation: BaseDatabaseCreation, original: Any, template: str) -> None:
    """Migrate under a working name and rename when done, so a worker killed mid-migration
    leaves no half-built template for the next run to copy."""
    quote = creation.connection.ops.quote_name
    test_settings = creation.connection.settings_dict["TEST"]
    worker_name = test_settings.get("NAME")
    building = f"{template}_building"
    test_settings["NAME"] = building
    try:
        original(creation, verbosity=0, autoclobber=True, serialize=False, keepdb=False)
    finally:
        test_settings["NAME"] = worker_name
    creation.connection.close()
    _execute_without_database(creation, f"ALTER DATABASE {quote(building)} RENAME TO {quote(template)}")
    stem = template.rsplit("_tpl_", 1)[0]
    for stale in _databases_like(creation, f"{stem}_tpl_%"):
        if stale != template:
            try:
                _execute_without_database(creation, f"DROP DATABASE IF EXISTS {quote(stale)}")
            except Exception:  # noqa: BLE001 - another run may still be copying it; the next build retries
                pass


def install() -> None:
    original = BaseDatabaseCreation.create_test_db

    def create_from_template(
        self: BaseDatabaseCreation, verbosity: int = 1, autoclobber: bool = False, serialize: bool = True, keepdb: bool = False
    ) -> str:
        if self.connection.vendor != "postgresql" or keepdb:
            return str(original(self, verbosity, autoclobber, serialize, keepdb))
        name = self._get_test_db_name()  # type: ignore[attr-defined]
        template = template_name(name)
        quote = self.connection.ops.quote_name
        with held_lock(template):
            if not _databases_like(self, template):
                _build_template(self, original, template)
            _execute_without_database(self, f"DROP DATABASE IF EXISTS {quote(name)}")
            _execute_without_database(self, f"CREATE DATABASE {quote(name)} TEMPLATE {quote(template)}")
        self.connection.close()
        settings.DATABASES[self.connection.alias]["NAME"] = name
        self.connection.settings_dict["NAME"] = name
        if serialize:
            self.connection._test_serialized_contents = self.serialize_db_to_string()  # type: ignore[attr-defined]
        self.connection.ensure_connection()
        return str(name)

    BaseDatabaseCreation.create_test_db = create_from_template  # type: ignore[method-assign]
