"""Least privilege in PostgreSQL: an owner role that migrations run as, and an app role that the
web processes, workers and beat run as, which can read and write oz0's rows and nothing more.

The app role is not a superuser, cannot create roles or databases, owns no table (so it can
neither alter nor drop one), has no CREATE on the schema, and holds none of the roles that read
server files or run programs (pg_read_server_files, pg_execute_server_program): a hole in a
view or a tool that reached SQL could touch rows, never the server. Everything here is
idempotent: run it again after adding an app or a migration and the grants follow (default
privileges cover what the owner creates later).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import connection
from psycopg import sql

from oz0site.config import idle_in_transaction_milliseconds

# What the app does to oz0's tables: rows only. Sequences: the ids of new rows.
TABLE_PRIVILEGES = "SELECT, INSERT, UPDATE, DELETE"
SEQUENCE_PRIVILEGES = "USAGE, SELECT, UPDATE"


@dataclass(frozen=True)
class Roles:
    owner: str
    app: str


def _role_exists(cursor: object, name: str) -> bool:
    cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [name])  # type: ignore[attr-defined]
    return cursor.fetchone() is not None  # type: ignore[attr-defined]


def _ensure_login_role(cursor: object, name: str, password: str | None) -> None:
    """A role that may log in and do nothing else by itself (attributes set every time: a role
    made by hand with more is brought back down)."""
    role = sql.Identifier(name)
    verb = "ALTER" if _role_exists(cursor, name) else "CREATE"
    attributes = sql.SQL("LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS")
    statement = sql.SQL("{} ROLE {} WITH {}").format(sql.SQL(verb), role, attributes)
    if password:
        statement = sql.SQL("{} PASSWORD {}").format(statement, sql.Literal(password))
    cursor.execute(statement)  # type: ignore[attr-defined]


def provision(roles: Roles, *, owner_password: str | None = None, app_password: str | None = None) -> list[str]:
    """Create or bring the two roles to their grants on the current database; run by an
    administrator (a superuser, or a role with CREATEROLE that owns the database). Returns what
    it did, one line each."""
    done: list[str] = []
    database = sql.Identifier(connection.settings_dict["NAME"])
    owner, app = sql.Identifier(roles.owner), sql.Identifier(roles.app)
    with connection.cursor() as cursor:
        _ensure_login_role(cursor, roles.owner, owner_password)
        _ensure_login_role(cursor, roles.app, app_password)
        done.append(f"roles {roles.owner} (migrations) and {roles.app} (the processes): login, nothing else")
        cursor.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}, {}").format(database, owner, app))
        cursor.execute(sql.SQL("ALTER SCHEMA public OWNER TO {}").format(owner))
        cursor.execute(sql.SQL("REVOKE CREATE ON SCHEMA public FROM PUBLIC"))
        cursor.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(app))
        # What an earlier install made as another role becomes the owner's: migrations alter it.
        # (A table's own sequences and triggers follow it.)
        cursor.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND pg_get_userbyid(c.relowner) <> %s",
            [roles.owner],
        )
        tables = [name for (name,) in cursor.fetchall()]
        for name in tables:
            cursor.execute(sql.SQL("ALTER TABLE {} OWNER TO {}").format(sql.Identifier("public", name), owner))
        cursor.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'public' AND pg_get_userbyid(p.proowner) <> %s",
            [roles.owner],
        )
        functions = [signature for (signature,) in cursor.fetchall()]
        for signature in functions:  # a regprocedure's text is already quoted where it must be
            cursor.execute(sql.SQL("ALTER FUNCTION {} OWNER TO {}").format(sql.SQL(signature), owner))
        if tables or functions:
            done.append(f"{len(tables)} tables and {len(functions)} functions now owned by {roles.owner}")
        cursor.execute(sql.SQL(f"GRANT {TABLE_PRIVILEGES} ON ALL TABLES IN SCHEMA public TO {{}}").format(app))
        cursor.execute(sql.SQL(f"GRANT {SEQUENCE_PRIVILEGES} ON ALL SEQUENCES IN SCHEMA public TO {{}}").format(app))
        for kind, privileges in (("TABLES", TABLE_PRIVILEGES), ("SEQUENCES", SEQUENCE_PRIVILEGES)):
            cursor.execute(
                sql.SQL(f"ALTER DEFAULT PRIVILEGES FOR ROLE {{}} IN SCHEMA public GRANT {privileges} ON {kind} TO {{}}").format(
                    owner, app
                )
            )
        done.append(f"{roles.app}: {TABLE_PRIVILEGES} on every table, now and after each migration")
        done.append(_bound_idle_transactions(cursor, app))
    return done


def _bound_idle_transactions(cursor: object, app: sql.Identifier) -> str:
    """The app role's sessions are ended by the server after DB_IDLE_IN_TRANSACTION_SECONDS idle
    inside a transaction (settings.py says why). Set on the role too, not only as each
    connection's startup option: PgBouncer does not pass that option on."""
    seconds = float(settings.DB_IDLE_IN_TRANSACTION_SECONDS)
    if seconds <= 0:
        cursor.execute(sql.SQL("ALTER ROLE {} RESET idle_in_transaction_session_timeout").format(app))  # type: ignore[attr-defined]
        return "sessions idle in a transaction: never ended by the server"
    milliseconds = sql.Literal(idle_in_transaction_milliseconds(seconds))
    statement = sql.SQL("ALTER ROLE {} SET idle_in_transaction_session_timeout = {}").format(app, milliseconds)
    cursor.execute(statement)  # type: ignore[attr-defined]
    return f"sessions idle in a transaction for {seconds:g} s: ended by the server, their locks freed"
