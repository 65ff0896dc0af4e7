"""Worker-side execution: claim a task through the kernel, run it while heartbeating, report back.

The claim is conditional, so a redelivered or duplicated Celery message finds nothing
to take. While a call runs, a heartbeat thread proves the claimant alive and carries the
kernel's stop request (a cancel or a lost join race) to the call. Claims and reports wait out a
database outage, and every thread replaces a connection that failed (runs.worker.reporting).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection

from oz0site import tracing
from oz0site.errors import is_database_error
from runs import kernel
from runs.kernel import Claimed, KernelError, check_storable
from runs.worker.harness import harness_of, run_harnessed_round
from runs.worker.reporting import DatabaseUnavailable, replace_connection, settle, with_database
from runs.worker.round_driver import run_round
from runs.worker.tool_functions import ToolCanceled, ToolContext, ToolError, function_of

log = logging.getLogger(__name__)


def worker_identity() -> str:
    """This process, as its claims and its database sessions name it: `host:pid`."""
    return f"{socket.gethostname()[:24]}:{os.getpid()}"


def new_claim() -> str:
    return f"{worker_identity()}:{uuid.uuid4().hex[:12]}"


def name_database_session(sender: Any = None, connection: Any = None, **kwargs: Any) -> None:
    """A `connection_created` receiver for worker processes: the session carries this process's
    name, so the lease sweep can end it if the process freezes inside a transaction
    (runs/kernel/holder_sessions.py). The name is read off the connection first: a pooled
    connection named already costs no round trip."""
    name = kernel.holder_session_name(worker_identity())
    raw = getattr(connection, "connection", None)
    info = getattr(raw, "info", None)
    if info is not None and info.parameter_status("application_name") == name:
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('application_name', %s, false)", [name])


class Heartbeat:
    """Proves a claim alive from a thread of its own; sets `cancel` when the kernel asks to stop.

    `beat` is the kernel call that renews the claim and answers whether to stop: one call's
    (`kernel.heartbeat`, by the claim they share). A worker that goes on to the next claim keeps
    the thread: it reports with the beats held (`held`), then `follow`s the next claim, which gets
    a `cancel` of its own. So no beat of a chunk's rows runs beside the report that settles them
    (the two would lock the rows in different orders), and the beat of a claim just settled,
    whose answer is "stop" since the claim is gone, stops nothing that follows it.
    """

    def __init__(self, beat: Callable[[], bool], name: str) -> None:
        self.beat = beat
        self.name = name
        self.cancel = threading.Event()
        self._beating = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"oz0-heartbeat-{name}", daemon=True)

    @contextmanager
    def held(self) -> Iterator[None]:
        """No beat while inside (one in flight is waited for)."""
        with self._beating:
            yield

    def follow(self, beat: Callable[[], bool]) -> threading.Event:
        """Prove the next claim alive from now on; answers that claim's own `cancel`."""
        with self._beating:
            self.beat = beat
            self.cancel = threading.Event()
            return self.cancel

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        interval = float(settings.OZ0_HEARTBEAT_SECONDS)
        try:
            while not self._stop.wait(interval):
                with self._beating:
                    try:
                        if self.beat():
                            self.cancel.set()
                    except Exception as error:  # a passing database hiccup must not kill the call
                        log.warning("heartbeat failed for %s: %s: %s", self.name, type(error).__name__, error)
                        if is_database_error(error):
                            # The next beat opens a new connection: this one may be dead for good
                            # (a restarted server), and nothing else in this thread would replace it.
                            replace_connection()
        finally:
            connection.close()


def execute_task(task_id: int, run_id: str | None = None, *, per_workspace: int = 0) -> Claimed | None:
    """Claim and run one task: the claim it ran under, or None when there was nothing to take or
    its workspace holds `per_workspace` workers already (then the task stays queued)."""
    close_old_connections()
    claim = new_claim()
    claimed = with_database(
        lambda: kernel.claim_task(run_id, task_id, claim, per_workspace=per_workspace), f"claiming task {task_id}"
    )
    if claimed is kernel.NO_ROOM:
        with_database(lambda: kernel.defer_queued(task_id), f"deferring task {task_id}")
        return None
    if not isinstance(claimed, Claimed):
        return None
    with Heartbeat(partial(kernel.heartbeat, claimed.claim), f"task {claimed.task_id}") as beat:
        execute_claimed(claimed, beat.cancel)
    return claimed


def execute_shared(task_id: int, run_id: str | None = None) -> None:
    """A tool call or model round on the shared workers, within its workspace's share of them
    (`OZ0_WORKER_SLOTS_PER_WORKSPACE`). Once it ran, the worker it held is free: the workspace's
    next queued calls go to the back of the queue, behind the other workspaces' messages."""
    slots = int(settings.OZ0_WORKER_SLOTS_PER_WORKSPACE)
    ran = execute_task(task_id, run_id, per_workspace=slots)
    if ran is not None and slots > 0:
        with_database(lambda: kernel.send_within_share(ran.run_id, slots), f"the share of run {ran.run_id}")


def execute_session(task_id: int, run_id: str | None = None) -> bool:
    """A harnessed round (F7) on the session worker, unless its workspace already holds its share
    of the session threads (`OZ0_SESSION_SLOTS_PER_WORKSPACE`): then False, and the caller sends
    it again later, so one workspace's sessions waiting on people never take every thread."""
    close_old_connections()
    slots = int(settings.OZ0_SESSION_SLOTS_PER_WORKSPACE)
    claim = new_claim()
    # The workspace's count and the claim in one transaction, under its lock: the cap is hard.
    taken = with_database(lambda: kernel.claim_session(run_id, task_id, claim, slots), f"claiming session {task_id}")
    if taken.full:
        return False
    if taken.claimed is None:
        return True
    claimed = taken.claimed
    with Heartbeat(partial(kernel.heartbeat, claimed.claim), f"task {claimed.task_id}") as beat:
        execute_claimed(claimed, beat.cancel)
    return True


def execute_claimed(claimed: Claimed, cancel: threading.Event) -> None:
    """Run a claimed call to its report, in its task's span (oz0site.tracing)."""
    with tracing.task_span(claimed):
        _execute_claimed(claimed, cancel)


def _execute_claimed(claimed: Claimed, cancel: threading.Event) -> None:
    if claimed.kind == "tool":
        guarded(claimed, lambda: run_tool(claimed, cancel))
    elif (harness := harness_of(claimed)) is not None:  # an agent written in a framework drives this round (F7)

        def harnessed() -> None:
            with tracing.harness_span(claimed, str(harness.get("kind"))):
                run_harnessed_round(claimed, cancel)

        guarded(claimed, harnessed)
    else:
        guarded(claimed, lambda: run_round(claimed, cancel))


def guarded(claimed: Claimed, body: Callable[[], None]) -> None:
    """Run a claimed call to its report (`body`). Whatever goes wrong on the way, the claim is never
    left behind: an unexpected exception settles the call as failed with the key `error`, where an
    abandoned claim would only be handed on by the lease sweep, again and again.

    A database that stays unreachable is not the call's failure: a report that could not be
    written, or a database error met while driving a round, leaves the claim to the lease sweep
    (a replayable call runs again, a non-replayable one waits for a person), never a false `failed`."""
    try:
        body()
    except DatabaseUnavailable:
        log.error("task %s (%s): its report could not be written; the lease sweep will hand it on", claimed.task_id, claimed.key)
    except Exception as error:
        if is_database_error(error):
            log.error(
                "task %s (%s) met a database error: %s; the lease sweep will hand it on", claimed.task_id, claimed.key, error
            )
            replace_connection()
            return
        log.exception("task %s (%s) failed in the worker", claimed.task_id, claimed.kind)
        try:
            settle(kernel.task_errored, claimed, error)
        except DatabaseUnavailable:
            log.error(
                "task %s (%s): its failure could not be written; the lease sweep will hand it on", claimed.task_id, claimed.key
            )


# How long one worker keeps running the quick calls its own chunks make ready, and how many
# it takes at a time: long enough to spare a chain its broker round trips, short enough to
# leave the rest of the work to the other workers.
CONTINUATION_SECONDS = 0.5
CONTINUATION_WIDTH = 2


def execute_batch(task_ids: list[int], run_id: str | None) -> None:
    """Claim a chunk of quick calls, run them in turn, settle them together."""
    close_old_connections()
    if run_id is None:
        for task_id in task_ids:
            execute_task(task_id)
        return
    deadline = time.monotonic() + CONTINUATION_SECONDS
    claim = new_claim()
    claimed = with_database(lambda: kernel.claim_batch(run_id, task_ids, claim), f"claiming a batch of {len(task_ids)}")
    if not claimed:
        return
    # One heartbeat thread for the whole message, following each claim in turn.
    with Heartbeat(partial(kernel.heartbeat, claim), f"batch {claim}") as beat:
        cancel = beat.cancel
        while claimed:
            outcomes = [batched_outcome(call, cancel) for call in claimed]
            # Quick calls this chunk made ready are run here next, for a while, rather than queued:
            # claimed in the transaction that settles this chunk.
            take = CONTINUATION_WIDTH if time.monotonic() < deadline else 0
            claim = new_claim()
            try:
                # The heartbeat waits while a report is written (the two would lock the rows in
                # different orders), but beats between tries while the database is away.
                claimed = with_database(
                    partial(kernel.report_batch, outcomes, take=take, then_claim=claim),
                    f"reporting a batch of {len(claimed)}",
                    holding=beat.held,
                )
            except DatabaseUnavailable:
                log.error("a batch of %d quick calls could not be reported; the lease sweep will hand it on", len(claimed))
                return
            except Exception as error:
                # As for a single call: no claim is left behind for the lease sweep to hand on forever.
                log.exception("a batch of %d quick calls could not be reported", len(claimed))
                for call in claimed:
                    try:
                        settle(kernel.task_errored, call, error)
                    except DatabaseUnavailable:
                        return
                return
            cancel = beat.follow(partial(kernel.heartbeat, claim))


def batched_outcome(claimed: Claimed, cancel: threading.Event) -> kernel.Outcome:
    """A call of a chunk, in its task's span (the chunk is reported together, after)."""
    with tracing.task_span(claimed):
        return tool_outcome(claimed, cancel)


def tool_outcome(claimed: Claimed, cancel: threading.Event) -> kernel.Outcome:
    """Run a claimed tool call and say how it ended, in its span; the caller reports it to the kernel."""
    with tracing.tool_span(claimed) as traced:
        outcome = _tool_outcome(claimed, cancel)
        traced.outcome(outcome.error[0] if outcome.error else None, stopped=outcome.stopped)
    return outcome


def _tool_outcome(claimed: Claimed, cancel: threading.Event) -> kernel.Outcome:
    name = claimed.spec.get("tool", "")
    function = function_of(name)
    if function is None:
        return kernel.Outcome(claimed, error=("tool_not_served", f"no worker tool named {name!r}"))
    context = ToolContext(
        run_id=claimed.run_id, task_key=claimed.key, attempt=claimed.attempt, cancel=cancel, execution=claimed.claim
    )
    try:
        value = function(dict(claimed.spec.get("args") or {}), context)
        check_storable(value)
    except ToolCanceled:
        return kernel.Outcome(claimed, stopped=True)
    except ToolError as error:
        return kernel.Outcome(claimed, error=(error.key, error.detail or None))
    except KernelError as error:
        return kernel.Outcome(claimed, error=("tool_failed", f"the tool's result cannot be stored: {error.detail}"))
    except Exception as error:  # a tool's bug is the tool's failure, never a stuck run
        if is_database_error(error):
            # The database away mid-call is no verdict on the tool: the claim is left to the lease
            # sweep (a replayable call runs again, a non-replayable one waits for a person), never
            # a false `tool_failed` (the chaos run met one: an effect's ledger write in the outage).
            raise
        log.exception("tool %s failed", name)
        return kernel.Outcome(claimed, error=("tool_failed", f"{type(error).__name__}: {error}"))
    return kernel.Outcome(claimed, value=value)


def run_tool(claimed: Claimed, cancel: threading.Event) -> None:
    outcome = tool_outcome(claimed, cancel)
    if outcome.stopped:
        settle(kernel.task_stopped, claimed)
    elif outcome.error is not None:
        settle(kernel.task_fail, claimed, outcome.error[0], outcome.error[1])
    else:
        settle(kernel.task_complete, claimed, outcome.value)
