"""What the worker tools do: one function a tool of the catalog (`runs.tools`), and the context it runs in.

A tool function takes its args and a `ToolContext`; it returns the result value or raises
`ToolError(key, detail)`. Long tools call `context.check_cancel()` (or sleep through
`context.sleep`) so a cancel or a lost race stops them promptly. Runner tools have no function
here: executors serve them on their own machines.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runs.tools import get_tool


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
    # This execution's own id (its claim): a tool whose write to the world can fail with no answer
    # (the connection dropped mid-write) keys the write by it, and asks the world afterwards
    # whether it was made, rather than making it twice or giving up on a call that did its work.
    execution: str = ""

    def check_cancel(self) -> None:
        if self.cancel.is_set():
            raise ToolCanceled()

    def sleep(self, seconds: float) -> None:
        if self.cancel.wait(max(0.0, seconds)):
            raise ToolCanceled()


ToolFn = Callable[[dict[str, Any], ToolContext], Any]


def function_of(name: str) -> ToolFn | None:
    """The function that runs worker tool `name` here, or None when this install serves no such worker tool."""
    tool = get_tool(name)
    if tool is None or tool.runner:
        return None
    return FUNCTIONS.get(name)


def _now(args: dict[str, Any], context: ToolContext) -> Any:
    return {"unix": time.time()}


FUNCTIONS: dict[str, ToolFn] = {
    "clock.now": _now,
}


def serve(name: str, function: ToolFn) -> None:
    """Add a worker tool's function from an app installed beside runs (the test tools' app): the
    catalog (`runs.tools`) names the tool; whether this install runs it is the installer's choice
    of apps."""
    FUNCTIONS[name] = function
