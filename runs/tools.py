"""The tool catalog: what each tool is, not how it runs.

Request compilation, manifests and the kernel read a tool's metadata here (replayable, quick,
runner, test-only); nothing in this module executes a tool or needs Celery. Worker tools run in
the workers (their functions live in `runs.worker.tool_functions`); runner tools are served by
executors outside the workers (S8).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
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
    """Whether the catalog knows `name`, served on this install or not (a test tool without OZ0_TEST_TOOLS)."""
    return name in _REGISTRY


def tool_names() -> list[str]:
    return sorted(name for name in _REGISTRY if get_tool(name) is not None)


# ---- test tools (API.md), installed with OZ0_TEST_TOOLS=1 ----

register(Tool("test.echo", "Returns its value", replayable=True, test_only=True, quick=True))
register(Tool("test.fail", "Fails with the given error key", replayable=True, test_only=True, quick=True))
register(Tool("test.sleep", "Sleeps, then returns the seconds", replayable=True, test_only=True))
register(Tool("test.flaky", "Fails its first n attempts, then succeeds", replayable=True, test_only=True))
register(Tool("test.effect", "Records one non-replayable execution", replayable=False, test_only=True))
register(Tool("test.effect_replayable", "Records one execution, replayable", replayable=True, test_only=True))
register(Tool("test.remote", "Served by executors (a runner tool)", replayable=False, runner=True, test_only=True))

register(Tool("clock.now", "The worker's current time", replayable=True, quick=True))

# Served by `./oz0 runner` on a person's machine: echoes text through the machine's own `echo`.
register(Tool("shell.echo", "Echoes text on the runner's machine (no shell is involved)", replayable=True, runner=True))
