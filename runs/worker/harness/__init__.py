"""Agents written in frameworks (F7): a harnessed agent's round is one task that its adapter drives
(`runs/worker/harness/<kind>.py`), speaking to oz0 through `base.HarnessSession`.

`run_harnessed_round` is the worker's side of such a round: pick the adapter, run it, and report
how it ended through the kernel, leaving no claim behind whatever happens.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from django.conf import settings

from oz0agents.code_version import code_digest
from runs import kernel
from runs.kernel import Claimed, KernelError, check_storable, round_timeout_seconds
from runs.models import Run, Task, TaskStatus
from runs.worker.harness import folders
from runs.worker.harness.base import (
    HarnessCanceled,
    HarnessError,
    HarnessParked,
    HarnessReleased,
    HarnessSession,
    HarnessUnavailable,
    JobEnded,
)

log = logging.getLogger(__name__)

ADAPTERS = {"jsonl": "jsonl", "pydantic_ai": "pydantic_ai", "openai_agents": "openai_agents", "acp": "acp"}


class Adapter(Protocol):
    def run(self, session: HarnessSession) -> Any: ...


def harness_of(claimed: Claimed) -> dict[str, Any] | None:
    """The harness of the agent whose round this is, or None for oz0's own loop (one query)."""
    if claimed.kind != "round":
        return None
    harness = Run.objects.filter(pk=claimed.run_id).values_list("agent_version__manifest__harness", flat=True).first()
    return harness if isinstance(harness, dict) and harness.get("kind") in ADAPTERS else None


def adapter_for(kind: str) -> Adapter:
    """The adapter module of a kind; a framework that is not installed is `HarnessUnavailable`."""
    try:
        module = importlib.import_module(f"runs.worker.harness.{ADAPTERS[kind]}")
    except ImportError as missing:
        raise HarnessUnavailable(f"the {kind} harness cannot be loaded here: {missing}") from None
    return module  # type: ignore[return-value]


def run_harnessed_round(claimed: Claimed, cancel: threading.Event) -> None:
    task = Task.objects.select_related("run", "run__agent_version").get(pk=claimed.task_id)
    run = task.run
    manifest = run.agent_version.manifest if run.agent_version else {}
    state = dict(claimed.state)
    state.pop("expired_claims", None)
    session = HarnessSession(claimed=claimed, task=task, run=run, manifest=manifest, cancel=cancel, state=state)
    # The code this round loads, as it is now: it may have changed since the run was created.
    session.code_digest = code_digest(manifest)
    kind = str(session.harness.get("kind"))
    seconds = round_timeout_seconds(session.harness) or float(settings.OZ0_ROUND_TIMEOUT_SECONDS)
    session.deadline, session.timeout_seconds = time.monotonic() + seconds, seconds
    finish_round(session, seconds, lambda: adapter_for(kind).run(session))


def finish_round(session: HarnessSession, seconds: float, body: Callable[[], Any]) -> None:
    """Drive the session (`body`: from its start, or on from a release) and report how it ended;
    `seconds` is the round's deadline, counted from its start (`session.deadline`). Then its
    round's kept folder goes, if the round needs it no more (folders.py)."""
    try:
        _finish_round(session, seconds, body)
    finally:
        if session.job_folder:
            try:
                folders.tidy(session.run.pk, session.task.pk, session.job_folder)
            except Exception as error:  # noqa: BLE001 - the folder stays for the sweep; the report stands
                log.warning("task %s: its job folder was not tidied: %s", session.task.pk, error)


def _finish_round(session: HarnessSession, seconds: float, body: Callable[[], Any]) -> None:
    claimed, cancel = session.claimed, session.cancel
    deadline = threading.Timer(max(0.0, session.deadline - time.monotonic()), session.expire)
    deadline.daemon = True
    deadline.start()
    try:
        output = body()
        check_storable(output)
    except (JobEnded, HarnessParked, HarnessReleased):
        # reported already: oz.fail, or the round parked or released while it waits on a person
        return
    except HarnessCanceled:
        if session.timed_out.is_set():
            _timed_out(session, seconds)
            return
        kernel.task_stopped(claimed, extra=session.extra())
        return
    except HarnessError as error:
        session.stderr = error.stderr or session.stderr
        if session.timed_out.is_set():
            _timed_out(session, seconds)
            return
        kernel.task_fail(claimed, error.key, error.detail, extra=session.extra(), state=session.state)
        return
    except KernelError as error:
        kernel.task_fail(
            claimed, "harness_protocol_error", f"the harness's output cannot be stored: {error.detail}", extra=session.extra()
        )
        return
    finally:
        deadline.cancel()
    if session.timed_out.is_set():
        _timed_out(session, seconds)
        return
    if cancel.is_set():
        kernel.task_stopped(claimed, extra=session.extra())
        return
    # Refused (typed, in the trace) when the run is being canceled meanwhile: a canceling run's
    # round is never `completed`.
    kernel.task_complete(claimed, output, extra=session.extra(), state=session.state)


def _timed_out(session: HarnessSession, seconds: float) -> None:
    """The round ran past its deadline (F7): its process was killed; `round_timeout`, kind `timeout`,
    with what it wrote on stderr and the tokens it reported, under the round's own policy."""
    kernel.task_fail(
        session.claimed,
        "round_timeout",
        f"the round ran past its deadline of {seconds:g} s (harness.timeout_s, else OZ0_ROUND_TIMEOUT_SECONDS); "
        "its process was killed",
        status=TaskStatus.TIMED_OUT,
        extra=session.extra(),
        state=session.state,
    )
