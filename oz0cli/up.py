"""`./oz0 up [--demo]`: services, static files, migrations and the demo, then web, worker, session
worker and beat under the supervisor (which restarts any of them, and the embedded services, when
they die) until Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import time
from urllib.parse import urlsplit, urlunsplit

import django
from django.conf import settings
from django.core.management import call_command
from django.db import connections

from oz0cli import processes, say
from oz0cli.embedded import EmbeddedPostgres
from oz0cli.environment import listen_address, plain_http_environment, up_environment, use_base_environment
from oz0cli.services import data_dir, services
from oz0cli.supervisor import Supervisor, wait_for_web
from oz0site.db_roles import Roles, provision

EMBEDDED_ROLES = Roles(owner="oz0_owner", app="oz0_app")
# How long `up` waits for its web process to answer before it says it is still waiting.
WEB_PATIENCE_SECONDS = 60


def as_role(database_url: str, role: str) -> str:
    """The same database as another role (trust authentication: no password)."""
    parts = urlsplit(database_url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{role}@{host}"))


def cmd_up(args: list[str]) -> int:
    os.environ.update(up_environment(args, dict(os.environ)))
    use_base_environment(debug=False)
    os.environ.update(plain_http_environment(os.environ))
    host, port = listen_address(os.environ)
    os.environ.setdefault("OZ0_QUEUE", "oz0")
    # Bound before anything starts, so a port another program holds is refused at once; kept open
    # for as long as `up` runs, so a web process started again serves the same socket.
    webs = processes.web_process_count(os.environ)
    listening: socket.socket | None = processes.web_socket(host, port)
    if listening is not None and listening.family != socket.AF_INET:
        # daphne adopts an inherited socket as IPv4: an IPv6 peer's address would reach the
        # sign-in throttle and the metrics allow-list garbled. One process binds the address itself.
        listening.close()
        listening, webs = None, 1
        say("OZ0_HOST is an IPv6 address: one web process, which listens by itself")
    if os.environ["OZ0_TEST_TOOLS"] in ("1", "true", "yes", "on"):
        say("the test.* tools are installed (--demo or OZ0_TEST_TOOLS=1): for trying oz0, never for a real install")
    with listening or contextlib.nullcontext(), services() as embedded:
        django.setup()
        if settings.OZ0_HARNESS_SANDBOX == "bwrap" and shutil.which("bwrap") is None:
            say(
                "bubblewrap is not installed: agents written in frameworks (F7) fail harness_unavailable until it is "
                "(Debian: apt-get install bubblewrap; docs/harnesses.md)"
            )
        started = time.monotonic()
        # Static files first: whitenoise indexes them when the web process starts. The web
        # process then boots while the database is migrated and the demo loaded.
        call_command("collectstatic", interactive=False, verbosity=0)
        # On the PostgreSQL it embeds, `up` is the administrator: its processes run as the app
        # role, which can touch rows and nothing else (oz0site/db_roles.py); it migrates as itself.
        least_privilege = any(isinstance(service, EmbeddedPostgres) for service in embedded)
        children = dict(os.environ)
        if least_privilege:
            provision(EMBEDDED_ROLES)
            children["DATABASE_URL"] = as_role(os.environ["DATABASE_URL"], EMBEDDED_ROLES.app)
        supervisor = Supervisor(children)
        for service in embedded:
            supervisor.watch(service)
        try:
            schedule = data_dir() / "celerybeat-schedule"

            def argv(role: str) -> list[str]:
                return processes.command(
                    role, python=sys.executable, host=host, port=port, schedule=schedule, environ=os.environ, listening=listening
                )

            for number in range(1, webs + 1):
                name = "web" if webs == 1 else f"web-{number}"
                inherits = (listening.fileno(),) if listening is not None else ()
                supervisor.start(name, argv("web"), env=processes.web_environment(os.environ), pass_fds=inherits)
            call_command("migrate", interactive=False, verbosity=0)
            call_command("demo")
            if least_privilege:  # what the migration made becomes the owner's; the app's grants follow
                provision(EMBEDDED_ROLES)
            connections.close_all()
            say(f"database ready in {time.monotonic() - started:.1f}s")
            if not supervisor.stopping.is_set():
                for role in processes.ROLES[1:]:
                    supervisor.start(role, argv(role))
            probe = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
            shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
            waited = 0
            # Never a silent give-up: until the web process answers or `up` is stopped, the address
            # is printed the moment it serves, with a word each minute that it is still awaited.
            while not wait_for_web(probe, port, supervisor, timeout=WEB_PATIENCE_SECONDS):
                if supervisor.stopping.is_set():
                    break
                waited += WEB_PATIENCE_SECONDS
                supervisor.line("oz0", f"the web process has not answered in {waited}s (a busy machine?): still waiting")
            else:
                supervisor.line("oz0", f"the console is at http://{shown}:{port}/  (log in with a demo user above; Ctrl-C stops)")
        except BaseException:
            supervisor.stop()
            raise
        return supervisor.wait()
