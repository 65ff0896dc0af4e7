"""Counts, inside the Celery worker processes the bench starts, what the tasks cost the database.

Loaded with `celery worker -I bench.probe` and switched on by OZ0_BENCH_PROBE_DIR: each worker
process counts the Celery tasks it ran, the SQL statements its Django connection executed
(savepoints included), the transactions it committed or rolled back, and the database sessions
it opened. After each task it writes its counters into its own small memory-mapped file in that
directory (a memory write, no system call, no round trip), and the bench sums the files before
and after a workload. The bench's own polling runs in the bench process, so it is in none of
these counts.

Round trips are derived: every statement is one, and every explicit transaction adds its BEGIN
(psycopg sends it before the first statement) and its COMMIT or ROLLBACK.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

FIELDS = ("tasks", "statements", "commits", "rollbacks", "sessions")
_FORMAT = "<" + "q" * len(FIELDS)
_SIZE = struct.calcsize(_FORMAT)
DIRECTORY = os.environ.get("OZ0_BENCH_PROBE_DIR", "")

_counts = dict.fromkeys(FIELDS, 0)
_slot: mmap.mmap | None = None


def _count_statement(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
    _counts["statements"] += 1
    return execute(sql, params, many, context)


def _publish() -> None:
    global _slot
    if _slot is None:
        path = Path(DIRECTORY) / f"probe-{os.getpid()}.bin"
        with open(path, "w+b") as handle:
            handle.write(b"\0" * _SIZE)
            handle.flush()
            _slot = mmap.mmap(handle.fileno(), _SIZE)
    struct.pack_into(_FORMAT, _slot, 0, *(_counts[f] for f in FIELDS))


def _install() -> None:
    from celery import signals
    from django.db import connection
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.signals import connection_created

    commit, rollback = BaseDatabaseWrapper._commit, BaseDatabaseWrapper._rollback

    def counted_commit(self: BaseDatabaseWrapper) -> None:
        if self.connection is not None:
            _counts["commits"] += 1
        commit(self)

    def counted_rollback(self: BaseDatabaseWrapper) -> None:
        if self.connection is not None:
            _counts["rollbacks"] += 1
        rollback(self)

    BaseDatabaseWrapper._commit = counted_commit  # type: ignore[method-assign]
    BaseDatabaseWrapper._rollback = counted_rollback  # type: ignore[method-assign]

    def on_connect(**kwargs: Any) -> None:
        _counts["sessions"] += 1

    def on_process_init(**kwargs: Any) -> None:
        _counts.update(dict.fromkeys(FIELDS, 0))
        connection.execute_wrappers.append(_count_statement)

    def on_task_done(**kwargs: Any) -> None:
        _counts["tasks"] += 1
        _publish()

    connection_created.connect(on_connect, weak=False)
    signals.worker_process_init.connect(on_process_init, weak=False)
    signals.task_postrun.connect(on_task_done, weak=False)


def snapshot(directory: str | Path) -> dict[str, int]:
    """The worker processes' counters summed (processes that exited keep their last figures)."""
    total = dict.fromkeys(FIELDS, 0)
    for path in Path(directory).glob("probe-*.bin"):
        data = path.read_bytes()
        if len(data) < _SIZE:
            continue
        for name, value in zip(FIELDS, struct.unpack_from(_FORMAT, data), strict=True):
            total[name] += value
    return total


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {name: after[name] - before[name] for name in FIELDS}


if DIRECTORY:
    _install()
