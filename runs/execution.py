"""Worker-side execution: claim a task through the kernel, run it while heartbeating, report back.

The claim is conditional, so a redelivered or duplicated Celery message finds nothing
to take. While a call runs, a heartbeat thread proves the claimant alive and carries the
kernel's stop request (a cancel or a lost join race) to the call.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid

from django.conf import settings
from django.db import close_old_connections, connection

from runs import kernel
from runs.kernel.errors import KernelError
from runs.kernel.transitions import Claimed
from runs.kernel.validation import check_storable
from runs.tools import ToolCanceled, ToolContext, ToolError, get_tool

log = logging.getLogger(__name__)


def new_claim() -> str:
    return f"{socket.gethostname()[:24]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


class Heartbeat:
    """Beats for one claimed call in a thread of its own; sets `cancel` when the kernel asks to stop."""

    def __init__(self, claimed: Claimed) -> None:
        self.claimed = claimed
        self.cancel = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"oz0-heartbeat-{claimed.task_id}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _beat(self) -> None:
        interval = float(settings.OZ0_HEARTBEAT_SECONDS)
        try:
            while not self._stop.wait(interval):
                try:
                    if kernel.heartbeat(self.claimed.task_id, self.claimed.claim):
                        self.cancel.set()
                except Exception:  # a passing database hiccup must not kill the call
                    log.exception("heartbeat failed for task %s", self.claimed.task_id)
        finally:
            connection.close()


def execute_task(task_id: int, run_id: str | None = None) -> None:
    close_old_connections()
    claimed = kernel.claim_task(task_id, new_claim(), run_id)
    if claimed is None:
        return
    with Heartbeat(claimed) as beat:
        if claimed.kind == "tool":
            run_tool(claimed, beat.cancel)
        else:
            from runs.rounds import run_round

            run_round(claimed, beat.cancel)


def run_tool(claimed: Claimed, cancel: threading.Event) -> None:
    name = claimed.spec.get("tool", "")
    tool = get_tool(name)
    if tool is None or tool.fn is None:
        kernel.task_fail(claimed.task_id, claimed.claim, "tool_not_served", f"no worker tool named {name!r}")
        return
    context = ToolContext(run_id=claimed.run_id, task_key=claimed.key, attempt=claimed.attempt, cancel=cancel)
    try:
        value = tool.fn(dict(claimed.spec.get("args") or {}), context)
        check_storable(value)
    except ToolCanceled:
        kernel.task_stopped(claimed.task_id, claimed.claim)
    except ToolError as error:
        kernel.task_fail(claimed.task_id, claimed.claim, error.key, error.detail or None)
    except KernelError as error:
        kernel.task_fail(claimed.task_id, claimed.claim, "tool_failed", f"the tool's result cannot be stored: {error.detail}")
    except Exception as error:  # a tool's bug is the tool's failure, never a stuck run
        log.exception("tool %s failed", name)
        kernel.task_fail(claimed.task_id, claimed.claim, "tool_failed", f"{type(error).__name__}: {error}")
    else:
        kernel.task_complete(claimed.task_id, claimed.claim, value)
