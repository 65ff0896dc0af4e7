"""The tool registry: kernel tools run in the workers, runner tools are advertised to executors.

A tool is a function of its args and a `ToolContext`; it returns the result value or raises
`ToolError(key, detail)`. Long tools call `context.check_cancel()` (or sleep through
`context.sleep`) so a cancel or a lost race stops them promptly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F


class ToolError(Exception):
    def __init__(self, key: str, detail: str = "") -> None:
        super().__init__(detail or key)
        self.key = key
        self.detail = detail


class ToolCanceled(Exception):
    """The kernel asked the call to stop (a run cancel or a join race it lost)."""


@dataclass
class ToolContext:
    run_id: str
    task_key: str
    attempt: int
    cancel: threading.Event = field(default_factory=threading.Event)

    def check_cancel(self) -> None:
        if self.cancel.is_set():
            raise ToolCanceled()

    def sleep(self, seconds: float) -> None:
        if self.cancel.wait(max(0.0, seconds)):
            raise ToolCanceled()


ToolFn = Callable[[dict[str, Any], ToolContext], Any]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    fn: ToolFn | None
    replayable: bool = False
    # A runner tool is served by executors outside the workers (S8).
    runner: bool = False
    test_only: bool = False
    # A quick tool computes its answer in memory in well under a millisecond and cannot block:
    # its ready calls travel to workers in chunks and settle in one transaction per chunk.
    # A quick tool must be replayable (a chunk lost with its worker is simply run again).
    quick: bool = False

    def __post_init__(self) -> None:
        if self.quick and not self.replayable:
            raise ValueError(f"tool {self.name}: a quick tool must be replayable")


_REGISTRY: dict[str, Tool] = {}


def register(tool: Tool) -> Tool:
    _REGISTRY[tool.name] = tool
    return tool


def get_tool(name: str) -> Tool | None:
    tool = _REGISTRY.get(name)
    if tool is None or (tool.test_only and not settings.OZ0_TEST_TOOLS):
        return None
    return tool


def is_registered(name: str) -> bool:
    """Whether the registry knows `name`, served on this install or not (a test tool without OZ0_TEST_TOOLS)."""
    return name in _REGISTRY


def tool_names() -> list[str]:
    return sorted(name for name in _REGISTRY if get_tool(name) is not None)


# ---- test tools (API.md), installed with OZ0_TEST_TOOLS=1 ----


def _echo(args: dict[str, Any], context: ToolContext) -> Any:
    return args.get("value")


def _fail(args: dict[str, Any], context: ToolContext) -> Any:
    raise ToolError(str(args.get("error") or "tool_failed"), str(args.get("detail") or ""))


def _seconds(args: dict[str, Any]) -> float:
    """A test tool's `seconds`, at most OZ0_TEST_SLEEP_MAX: a worker slot is shared by every workspace."""
    raw = args.get("seconds") or 0
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise ToolError("tool_failed", "`seconds` must be a number")
    try:
        seconds = float(raw)
    except ValueError:
        raise ToolError("tool_failed", "`seconds` must be a number") from None
    cap = float(settings.OZ0_TEST_SLEEP_MAX)
    if not 0 <= seconds <= cap:
        raise ToolError("tool_failed", f"`seconds` must be from 0 to {cap:g} (OZ0_TEST_SLEEP_MAX)")
    return seconds


def _sleep(args: dict[str, Any], context: ToolContext) -> Any:
    context.sleep(_seconds(args))
    return args.get("seconds")


def _flaky(args: dict[str, Any], context: ToolContext) -> Any:
    from runs.models import FlakyCounter

    flaky_id = str(args.get("id") or f"{context.run_id}:{context.task_key}")
    with transaction.atomic():
        counter, _ = FlakyCounter.objects.select_for_update().get_or_create(flaky_id=flaky_id)
        FlakyCounter.objects.filter(pk=counter.pk).update(attempts=F("attempts") + 1)
        seen = counter.attempts + 1
    if seen <= int(args.get("fail_times") or 0):
        raise ToolError("tool_failed", f"flaky failure {seen} of {args.get('fail_times')}")
    return {"attempts": seen}


def _effect(replayable: bool) -> ToolFn:
    def run(args: dict[str, Any], context: ToolContext) -> Any:
        from runs.models import EffectRecord, Run

        seconds = _seconds(args)
        workspace_id = Run.objects.filter(pk=context.run_id).values_list("workspace_id", flat=True).first()
        # The effect commits at once, as a real write to the world would.
        EffectRecord.objects.create(effect_id=str(args.get("id")), replayable=replayable, workspace_id=workspace_id)
        # Optional: stay in the call a while after the effect, so a test can kill the worker mid-call.
        context.sleep(seconds)
        return {"id": args.get("id")}

    return run


register(Tool("test.echo", "Returns its value", _echo, replayable=True, test_only=True, quick=True))
register(Tool("test.fail", "Fails with the given error key", _fail, replayable=True, test_only=True, quick=True))
register(Tool("test.sleep", "Sleeps, then returns the seconds", _sleep, replayable=True, test_only=True))
register(Tool("test.flaky", "Fails its first n attempts, then succeeds", _flaky, replayable=True, test_only=True))
register(Tool("test.effect", "Records one non-replayable execution", _effect(False), replayable=False, test_only=True))
register(Tool("test.effect_replayable", "Records one execution, replayable", _effect(True), replayable=True, test_only=True))
register(Tool("test.remote", "Served by executors (a runner tool)", None, replayable=False, runner=True, test_only=True))


def _now_tool(args: dict[str, Any], context: ToolContext) -> Any:
    return {"unix": time.time()}


register(Tool("clock.now", "The worker's current time", _now_tool, replayable=True, quick=True))


# Served by `./oz0 runner` on a person's machine: echoes text through the machine's own `echo`.
register(Tool("shell.echo", "Echoes text on the runner's machine (no shell is involved)", None, replayable=True, runner=True))
