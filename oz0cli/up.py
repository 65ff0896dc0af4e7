"""`./oz0 up [--demo]`: services, static files, migrations and the demo, then web, worker, session
worker and beat under the supervisor (which restarts any of them, and the embedded services, when
they die) until Ctrl-C."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time

import django
from django.conf import settings
from django.core.management import call_command
from django.db import connections

from oz0cli import Fatal, say
from oz0cli.environment import listen_address, plain_http_environment, up_environment, use_base_environment
from oz0cli.services import data_dir, services
from oz0cli.supervisor import Supervisor, wait_for_port


def check_can_listen(host: str, port: int) -> None:
    """Refuse a port another program listens on. SO_REUSEADDR, as the web server binds: the
    connections of a `./oz0 up` just stopped linger in TIME_WAIT for a minute and must not stop
    the next one from starting at once."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as error:
            raise Fatal(f"OZ0_PORT: cannot listen on {host}:{port} ({error.strerror or error})") from None


def cmd_up(args: list[str]) -> int:
    os.environ.update(up_environment(args, dict(os.environ)))
    use_base_environment(debug=False)
    os.environ.update(plain_http_environment(os.environ))
    host, port = listen_address(os.environ)
    queue = os.environ.setdefault("OZ0_QUEUE", "oz0")
    check_can_listen(host, port)
    if os.environ["OZ0_TEST_TOOLS"] in ("1", "true", "yes", "on"):
        say("the test.* tools are installed (--demo or OZ0_TEST_TOOLS=1): for trying oz0, never for a real install")
    with services() as embedded:
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
        supervisor = Supervisor(dict(os.environ))
        for service in embedded:
            supervisor.watch(service)
        python = sys.executable
        try:
            # Under ASGI, Django's advice is no persistent connections (they belong to the workers):
            # the web process takes its connections from a pool (OZ0_WEB_DB_POOL_SIZE, 0: a new
            # session per request); a DB_CONN_MAX_AGE of the person's own still wins without a pool.
            web_env = {
                "DB_CONN_MAX_AGE": os.environ.get("DB_CONN_MAX_AGE", "0"),
                "DB_POOL_SIZE": os.environ.get("OZ0_WEB_DB_POOL_SIZE", "8"),
            }
            supervisor.start(
                "web", [python, "-m", "daphne", "-b", host, "-p", str(port), "oz0site.asgi:application"], env=web_env
            )
            call_command("migrate", interactive=False, verbosity=0)
            call_command("demo")
            connections.close_all()
            say(f"database ready in {time.monotonic() - started:.1f}s")
            if not supervisor.stopping.is_set():
                level = os.environ.get("CELERY_LOG_LEVEL", "warning")
                celery = [python, "-m", "celery", "-A", "oz0site"]
                processes = str(settings.OZ0_WORKER_CONCURRENCY)
                # -O fair: a task goes to a process that is free, never into the pipe of one busy with a
                # slow call (Celery's default), where a quick call would wait out the slow one.
                worker = [*celery, "worker", "-Q", queue, "-c", processes, "-O", "fair", "-l", level]
                worker += ["--without-mingle", "--without-gossip"]
                supervisor.start("worker", worker)
                # Harnessed rounds (F7) wait on people and tool calls: a thread each, never a worker slot.
                sessions = [*celery, "worker", "-Q", settings.OZ0_SESSION_QUEUE, "-P", "threads", "-n", "sessions@%h"]
                slots = str(settings.OZ0_SESSION_SLOTS)
                supervisor.start("sessions", [*sessions, "-c", slots, "-l", level, "--without-mingle", "--without-gossip"])
                schedule = data_dir() / "celerybeat-schedule"
                supervisor.start("beat", [*celery, "beat", "-s", str(schedule), "-l", level])
            probe = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
            if wait_for_port(probe, port, supervisor, timeout=60):
                shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
                supervisor.line("oz0", f"the console is at http://{shown}:{port}/  (log in with a demo user above; Ctrl-C stops)")
        except BaseException:
            supervisor.stop()
            raise
        return supervisor.wait()
