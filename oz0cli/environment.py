"""What every command puts into the environment its children (web, worker, beat, pytest, manage.py) inherit."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, MutableMapping

from oz0cli import Fatal
from oz0cli.services import data_dir


def secret_key() -> str:
    """A SECRET_KEY of this install, kept in the data directory, for when none is given."""
    path = data_dir() / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50) + "\n")
        path.chmod(0o600)
    return path.read_text().strip()


def base_environment(environ: Mapping[str, str], *, debug: bool) -> dict[str, str]:
    """What every command adds: the person's own values win (an empty SECRET_KEY counts as unset)."""
    defaults = {"DJANGO_SETTINGS_MODULE": "oz0site.settings", "PYTHONUNBUFFERED": "1", "DEBUG": "1" if debug else "0"}
    added = {name: value for name, value in defaults.items() if name not in environ}
    if not environ.get("SECRET_KEY"):
        added["SECRET_KEY"] = secret_key()
    return added


def use_base_environment(*, debug: bool) -> None:
    os.environ.update(base_environment(os.environ, debug=debug))


def use_bytecode_cache(environ: MutableMapping[str, str]) -> None:
    """Let the test processes keep compiled bytecode, in the data directory (PYTHONPYCACHEPREFIX,
    unless the person chose one), even where PYTHONDONTWRITEBYTECODE is set. A run of the suite
    starts many Python processes (xdist workers, manage.py, ./oz0, the live stack, harness
    bridges), and without .pyc files each compiles Django, Celery and oz0 from source again: a
    `manage.py check` took 4.1 s of CPU so, 1.6 s with the cache. The cache lies outside the
    source tree, which is what PYTHONDONTWRITEBYTECODE keeps clean."""
    environ.pop("PYTHONDONTWRITEBYTECODE", None)
    if not environ.get("PYTHONPYCACHEPREFIX"):
        environ["PYTHONPYCACHEPREFIX"] = str(data_dir() / "pycache")


def up_environment(args: list[str], environ: dict[str, str]) -> dict[str, str]:
    """What `./oz0 up [--demo]` sets. The deterministic `test.*` tools are for trying oz0 (and for
    its tests), never for a real install: only `--demo` or OZ0_TEST_TOOLS=1 turns them on. The demo
    workspace loads either way; its runs use only what every install has."""
    unknown = [arg for arg in args if arg != "--demo"]
    if unknown:
        raise Fatal(f"up takes only --demo (got {' '.join(unknown)}); set OZ0_PORT / OZ0_HOST for the address")
    if "--demo" in args:
        return {"OZ0_TEST_TOOLS": "1"}
    return {"OZ0_TEST_TOOLS": environ.get("OZ0_TEST_TOOLS") or "0"}


def plain_http_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """`up` serves plain HTTP on this machine: a TLS-terminating proxy in front turns these back on."""
    names = ("SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE")
    return {name: "0" for name in names if name not in environ}


def listen_address(environ: Mapping[str, str]) -> tuple[str, int]:
    """OZ0_HOST and OZ0_PORT, where `up` serves the console."""
    host = environ.get("OZ0_HOST", "127.0.0.1")
    try:
        port = int(environ.get("OZ0_PORT", "8000"))
    except ValueError:
        raise Fatal(f"OZ0_PORT must be a port number, not {environ['OZ0_PORT']!r}") from None
    return host, port
