"""A round's job folder, kept across its sessions (issue 29: retries resume).

Each harness process works in a folder of its own (sandbox.py). A harnessed round's is its round's,
`<jobs folder>/<run>-<round>`, not a fresh one per session: a session of the round started again
on this machine (a person's retry, a crash, a lost worker's round taken by the lease sweep, a
parked session resumed) finds what the earlier ones left there. An ACP agent that keeps its
sessions under its working folder can then load the earlier session (`session/load`), and any
program may pick up its own files. It is removed once the round needs it no more: when a
session's report completes the round or ends its run (`tidy`), and otherwise, at the next session
this worker starts (at most once a minute), when its run has ended or is gone (pruned by
retention, OZ0_RETENTION_DAYS), or when no session touched it for KEEP_SECONDS (a week). A session of the round on another machine starts with a folder of
its own there, empty: the folder is the machine's, not the run's.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
import time
import uuid
from typing import Any

from runs.kernel import FINISHED_RUN_STATUSES
from runs.models import Run, Task, TaskStatus
from runs.worker.harness.sandbox import JOBS, SandboxUnavailable, jobs_folder

log = logging.getLogger(__name__)

SWEEP_SECONDS = 60.0
# A kept folder no session touched for this long goes even while its run is open (a run left
# waiting on a person for a week starts its next session with an empty folder).
KEEP_SECONDS = 7 * 24 * 3600.0
_swept = 0.0
_sweep_lock = threading.Lock()
NAME = re.compile(r"^([0-9a-f]{32})-([A-Za-z0-9_.]{1,31})$")


def folder_name(run_id: Any, key: str) -> str:
    """The kept folder of the round `key` of the run `run_id` (short enough for a socket's path in it)."""
    return f"{uuid.UUID(str(run_id)).hex}-{re.sub(r'[^A-Za-z0-9_.]', '_', key)[:31]}"


def remove(name: str) -> None:
    try:
        shutil.rmtree(jobs_folder() / name)
    except FileNotFoundError:
        pass
    except (OSError, SandboxUnavailable) as error:
        log.warning("the job folder %s/%s could not be removed: %s", JOBS, name, error)


def tidy(run_id: Any, task_id: int, name: str) -> None:
    """After a session's report: remove its round's folder when the round completed or its run ended."""
    row = Task.objects.filter(pk=task_id).values_list("status", "run__status").first()
    if row is None or row[0] == TaskStatus.COMPLETED or row[1] in FINISHED_RUN_STATUSES:
        remove(name)


def sweep(now: float | None = None) -> int:
    """Remove the kept folders whose run has ended or is gone (at most once every SWEEP_SECONDS);
    how many were removed."""
    global _swept
    now = time.monotonic() if now is None else now
    with _sweep_lock:
        if _swept and now - _swept < SWEEP_SECONDS:
            return 0
        _swept = now
    try:
        names = os.listdir(jobs_folder())
    except (OSError, SandboxUnavailable):
        return 0
    by_run: dict[str, list[str]] = {}
    for name in names:
        found = NAME.match(name)
        if found is not None:
            by_run.setdefault(str(uuid.UUID(found.group(1))), []).append(name)
    if not by_run:
        return 0
    open_runs = {
        str(pk)
        for pk in Run.objects.filter(pk__in=list(by_run))
        .exclude(status__in=list(FINISHED_RUN_STATUSES))
        .values_list("pk", flat=True)
    }
    removed = 0
    stale = time.time() - KEEP_SECONDS
    for run_id, kept in by_run.items():
        for name in kept:
            if run_id in open_runs and not _untouched_since(name, stale):
                continue
            remove(name)
            removed += 1
    return removed


def _untouched_since(name: str, when: float) -> bool:
    try:
        return os.lstat(jobs_folder() / name).st_mtime < when
    except (OSError, SandboxUnavailable):
        return False
