"""A whole oz0 of the session's own, to break (bench/chaos_stack.py): its own PostgreSQL and Redis
(never the machine's, which other test sessions share), web, two workers, the session worker and
beat, on the clocks of the live tests (lease 5 s, heartbeat 0.5 s, sweeps every 0.5 s).

The tests here talk to it as clients do (HTTP, a bearer token) and read its database with psycopg.
Each test leaves every process and service running again for the next."""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from bench.chaos import PROFILES, Client
from bench.chaos_stack import Stack

PROFILE = PROFILES["test"]


@pytest.fixture(scope="session")
def own_stack() -> Iterator[Stack]:
    stack = Stack(PROFILE.timing)
    try:
        stack.up()
        yield stack
    finally:
        stack.down()


@pytest.fixture
def stack(own_stack: Stack) -> Iterator[Stack]:
    """The session's stack, whole again after the test (every process running, both services up)."""
    yield own_stack
    if not own_stack.redis.pings():
        own_stack.redis.start()
    if not own_stack.postgres.embedded.alive():
        own_stack.postgres.restart()
    own_stack.postgres.signal(signal.SIGCONT)
    for name in ("web", *own_stack.WORKERS, "sessions", "beat"):
        process = own_stack.processes.get(name)
        if process is not None:
            own_stack.signal_group(name, signal.SIGCONT)
        if process is None or process.poll() is not None:
            own_stack.start(name)


@pytest.fixture
def client(stack: Stack) -> Iterator[Client]:
    client = Client(stack)
    yield client
    client.close()


def tag() -> str:
    return uuid.uuid4().hex[:10]


def create(client: Client, tasks: list[dict[str, Any]], deliverable: str, **extra: Any) -> str:
    status, body = client.call(
        "POST", f"/workspaces/{client.stack.workspace}/runs", {"tasks": tasks, "deliverable": deliverable, **extra}
    )
    assert status == 201, body
    return str(body["run"]["id"])


def task_row(stack: Stack, run_id: str, key: str) -> dict[str, Any]:
    rows = stack.query(
        "SELECT status, error_key, attempt, heartbeat_at, claim FROM runs_task WHERE run_id::text = %s AND key = %s",
        (run_id, key),
    )
    assert rows, (run_id, key)
    status, error_key, attempt, heartbeat_at, claim = rows[0]
    return {"status": status, "error_key": error_key, "attempt": attempt, "heartbeat_at": heartbeat_at, "claim": claim}


def run_status(stack: Stack, run_id: str) -> str:
    try:
        return str(stack.query("SELECT status FROM runs_run WHERE id::text = %s", (run_id,))[0][0])
    except Exception:
        return "unknown"  # the database is away


def effects(stack: Stack, effect_id: str) -> int:
    return int(stack.query("SELECT count(*) FROM testtools_effectrecord WHERE effect_id = %s", (effect_id,))[0][0])


def events(stack: Stack, run_id: str, event: str) -> list[tuple[Any, ...]]:
    return stack.query(
        "SELECT task_key, at, data FROM runs_traceevent WHERE run_id::text = %s AND event = %s ORDER BY seq", (run_id, event)
    )


def wait(predicate: Any, *, timeout: float, message: str) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except Exception as error:  # the stack's database may be away for a moment
            last = error
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}; last value: {last!r}")
