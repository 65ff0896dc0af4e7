"""How both framework bridges load an agent's code: the framework and the agent's module with the
collector paused, then frozen; a target that does not load, or is not the framework's agent, ends
the bridge with UNAVAILABLE_EXIT and a line on stderr.

Standard library only, and no oz0: a bridge imports this from its own folder before it takes that
folder and the install off sys.path, so the agent's code can import neither.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

UNAVAILABLE_EXIT = 69


@contextlib.contextmanager
def collector_paused_while_loading() -> Iterator[None]:
    """The framework and the agent's module build thousands of objects (a model class each) that
    live as long as this process: the collector pauses while they load, then freezes them out of
    its later passes. A tenth of the load's CPU, which every session pays as its process starts."""
    gc.disable()
    try:
        yield
    finally:
        gc.collect()
        gc.freeze()
        gc.enable()


def load_agent(target: str, *, framework: str, agent_class: Callable[[], type], expected: str) -> Any:
    """`module:attribute.path` as the framework's agent (`agent_class` imports the framework's
    class, inside the pause); `framework` and `expected` name them in the refusals."""
    module_name, _, attribute = target.partition(":")
    try:
        with collector_paused_while_loading():
            agent_type = agent_class()
            value: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            value = getattr(value, part)
    except Exception as error:  # whatever its module raised while it loaded
        print(f"cannot load the {framework} agent {target!r}: {type(error).__name__}: {error}", file=sys.stderr)
        sys.exit(UNAVAILABLE_EXIT)
    if not isinstance(value, agent_type):
        print(f"{target!r} is a {type(value).__name__}, not {expected}", file=sys.stderr)
        sys.exit(UNAVAILABLE_EXIT)
    return value
