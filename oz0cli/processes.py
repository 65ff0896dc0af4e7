"""The command line of each of oz0's long-lived processes, in one place: `./oz0 up` starts them all
under its supervisor, `./oz0 serve ROLE` runs one of them in the foreground (what a container, a
systemd unit or a Kubernetes pod runs), and the deployment files in deploy/ name the roles, never
the command lines, so a machine of its own runs exactly what `up` runs on one."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

from oz0cli import Fatal

# The roles `./oz0 serve` knows, in the order `up` starts them.
ROLES = ("web", "worker", "sessions", "beat")
# Under ASGI, Django's advice is no persistent connections (they belong to the workers): the web
# process takes its connections from a pool (OZ0_WEB_DB_POOL_SIZE, 0: a new session per request);
# a DB_CONN_MAX_AGE of the person's own still wins without a pool.
WEB_POOL_SIZE = "8"
# daphne serves from one interpreter, so one web process uses at most a core. `up` can start
# several on one listening socket; the kernel hands each new connection to a process that is
# calling accept, so a busy one takes fewer. One by default: on two cores, two processes gave a
# hostile workspace's closed loop more of the machine and a quiet one's p95 more than doubled
# where one process held it to about 3× (bench/README.md, neighbors). At most this many.
MAX_WEB_PROCESSES = 32
# Connections the kernel queues on the shared socket while every web process is busy or starting.
LISTEN_BACKLOG = 1024


def web_environment(environ: Mapping[str, str]) -> dict[str, str]:
    return {
        "DB_CONN_MAX_AGE": environ.get("DB_CONN_MAX_AGE", "0"),
        "DB_POOL_SIZE": environ.get("OZ0_WEB_DB_POOL_SIZE", WEB_POOL_SIZE),
    }


def web_process_count(environ: Mapping[str, str]) -> int:
    """OZ0_WEB_PROCESSES (default 1): how many web processes `up` runs on its listening socket."""
    raw = environ.get("OZ0_WEB_PROCESSES", "").strip()
    if not raw:
        return 1
    try:
        count = int(raw)
    except ValueError:
        count = 0
    if not 1 <= count <= MAX_WEB_PROCESSES:
        raise Fatal(f"OZ0_WEB_PROCESSES must be a whole number from 1 to {MAX_WEB_PROCESSES}, not {raw!r}")
    return count


def web_socket(host: str, port: int) -> socket.socket:
    """The listening socket every web process of `up` accepts on, inherited by each (daphne --fd).
    SO_REUSEADDR: the connections of a `./oz0 up` just stopped linger in TIME_WAIT for a minute and
    must not stop the next one from starting at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(LISTEN_BACKLOG)
    except OSError as error:
        sock.close()
        raise Fatal(f"OZ0_PORT: cannot listen on {host}:{port} ({error.strerror or error})") from None
    sock.set_inheritable(True)
    return sock


def command(
    role: str,
    *,
    python: str,
    host: str,
    port: int,
    schedule: Path,
    environ: Mapping[str, str],
    listening: socket.socket | None = None,
) -> list[str]:
    """The argv of one role. `environ` holds the settings the command line itself carries (the queue,
    the log level); the process reads every other setting from its environment. `listening`: a web
    process serves that inherited socket (`up`'s several) instead of binding host:port itself."""
    from django.conf import settings

    level = environ.get("CELERY_LOG_LEVEL", "warning")
    celery = [python, "-m", "celery", "-A", "oz0site"]
    quiet = ["--without-mingle", "--without-gossip"]
    if role == "web":
        if listening is not None:
            # IPv4 or IPv6 alike: twisted reads the family off the socket's own address.
            return [python, "-m", "daphne", "--fd", str(listening.fileno()), "oz0site.asgi:application"]
        return [python, "-m", "daphne", "-b", host, "-p", str(port), "oz0site.asgi:application"]
    if role == "worker":
        # -O fair: a task goes to a process that is free, never into the pipe of one busy with a
        # slow call (Celery's default), where a quick call would wait out the slow one.
        queue = environ.get("OZ0_QUEUE", "oz0")
        processes = str(settings.OZ0_WORKER_CONCURRENCY)
        return [*celery, "worker", "-Q", queue, "-c", processes, "-O", "fair", "-l", level, *quiet]
    if role == "sessions":
        # Harnessed rounds (F7) wait on people and tool calls: a thread each, never a worker slot.
        slots = str(settings.OZ0_SESSION_SLOTS)
        threads = ["worker", "-Q", settings.OZ0_SESSION_QUEUE, "-P", "threads", "-n", "sessions@%h"]
        return [*celery, *threads, "-c", slots, "-l", level, *quiet]
    if role == "beat":
        return [*celery, "beat", "-s", str(schedule), "-l", level]
    raise Fatal(f"serve takes one of {', '.join(ROLES)} (got {role!r})")


def required_settings(environ: Mapping[str, str]) -> list[str]:
    """What `serve` will not guess: a process of a deployment shares these with every other one."""
    return [name for name in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY") if not environ.get(name)]


def cmd_serve(args: list[str]) -> int:
    """`./oz0 serve ROLE`: one process in the foreground, replaced by its command (signals reach it
    directly). Unlike `up` it starts no service, migrates nothing and makes no secret: a deployment
    gives DATABASE_URL, REDIS_URL and SECRET_KEY, and migrates once (`./oz0 manage migrate`)."""
    import django

    from oz0cli.environment import listen_address, use_base_environment
    from oz0cli.services import data_dir

    if len(args) != 1:
        raise Fatal(f"serve takes one role: {' | '.join(ROLES)}")
    missing = required_settings(os.environ)
    if missing:
        raise Fatal(f"serve needs {', '.join(missing)} (the same for every process of the deployment)")
    use_base_environment(debug=False)
    django.setup()
    host, port = listen_address({"OZ0_HOST": "0.0.0.0", **os.environ})
    argv = command(
        args[0], python=sys.executable, host=host, port=port, schedule=data_dir() / "celerybeat-schedule", environ=os.environ
    )
    if args[0] == "web":
        os.environ.update(web_environment(os.environ))
    sys.stdout.flush()
    os.execv(argv[0], argv)
    return 0  # not reached: the process became its role
