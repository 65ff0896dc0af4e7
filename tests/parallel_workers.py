"""A pytest plugin (`-p tests.parallel_workers` in pyproject's addopts): when pytest-xdist splits a
lane over worker processes, each worker after the first takes a Redis database and a channel
prefix of its own, as `./oz0 test`'s lanes do. pytest-django already gives each worker its own
test database; in Redis, numbered ids of those databases would meet (a workspace's membership
stamp, the cache, the sign-in throttle's counters).

It runs when pytest loads plugins, before pytest-django reads the settings, which is the last
moment the environment can still choose them."""

from __future__ import annotations

import os

from oz0cli.checks import next_redis_database

# Lanes of `./oz0 test` take the Redis databases after their own base (oz0cli.checks.plan_lanes):
# workers start beyond them.
FIRST_FREE_REDIS_STEP = 4


def worker_number(environ: os._Environ[str] | dict[str, str]) -> int:
    """0 outside xdist and for its first worker (gw0), N for worker gwN."""
    worker = environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0


def keep_workers_apart(environ: os._Environ[str] | dict[str, str]) -> None:
    number = worker_number(environ)
    if number == 0 or not environ.get("REDIS_URL"):
        return
    environ["REDIS_URL"] = next_redis_database(environ["REDIS_URL"], FIRST_FREE_REDIS_STEP + number - 1)
    environ["OZ0_CHANNEL_PREFIX"] = f"{environ.get('OZ0_CHANNEL_PREFIX') or 'oz0'}-gw{number}"


keep_workers_apart(os.environ)
