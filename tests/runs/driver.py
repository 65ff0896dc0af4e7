"""Drive a run to quiescence in-process, without Celery: claim each queued task through the
kernel, execute it the way a worker would, report back. Deterministic, for unit and
property tests of the kernel."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from runs import kernel
from runs.models import Run, Task, TraceEvent
from runs.worker.execution import execute_claimed


def queued(run: Run) -> list[Task]:
    return list(
        Task.objects.filter(run=run, status="waiting", ready=True, kind__in=("tool", "round", "summarizer")).order_by("position")
    )


# The cancel event a driven call gets (a test may give one whose waits return at once).
cancel_event: Callable[[], threading.Event] = threading.Event


def step(run: Run, task: Task) -> bool:
    claimed = kernel.claim_task(run.pk, task.pk, f"driver:{task.pk}:{task.attempt}")
    if claimed is None:
        return False
    # The worker's own path after its claim: an unexpected exception settles the call, as in a worker.
    execute_claimed(claimed, cancel_event())
    return True


def drive(run: Run, *, limit: int = 10_000) -> Run:
    """Run every queued task until nothing is queued; returns the refreshed run."""
    for _ in range(limit):
        ready = queued(run)
        if not ready:
            break
        for task in ready:
            step(run, task)
    run.refresh_from_db()
    return run


def statuses(run: Run) -> dict[str, str]:
    return dict(Task.objects.filter(run=run).values_list("key", "status"))


def task(run: Run, key: str) -> Task:
    return Task.objects.get(run=run, key=key)


def trace(run: Run) -> list[dict[str, Any]]:
    return [
        {"seq": s, "task": k, "event": e, "from": f, "to": t, "error": err, "data": d}
        for s, k, e, f, t, err, d in TraceEvent.objects.filter(run=run)
        .order_by("seq")
        .values_list("seq", "task_key", "event", "from_status", "to_status", "error", "data")
    ]


def echo(key: str, value: Any = 1, *, after: list[str] | None = None, on_failure: str = "propagate") -> dict[str, Any]:
    return {
        "key": key,
        "kind": "tool",
        "tool": "test.echo",
        "args": {"value": value},
        "after": after or [],
        "on_failure": on_failure,
    }


def fail(
    key: str, *, after: list[str] | None = None, on_failure: str = "propagate", error: str = "tool_failed"
) -> dict[str, Any]:
    return {
        "key": key,
        "kind": "tool",
        "tool": "test.fail",
        "args": {"error": error, "detail": f"{key} failed"},
        "after": after or [],
        "on_failure": on_failure,
    }


def join(key: str, after: list[str], mode: str = "all", quorum: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"key": key, "kind": "join", "mode": mode, "after": after}
    if quorum is not None:
        spec["quorum"] = quorum
    return spec
