"""The import-target harnesses (`pydantic_ai`, `openai_agents`): the agent object a manifest names
is loaded and run in a child process of its own, a bridge speaking the JSON-lines protocol v2 to
the worker, confined like every harness process (runs/worker/harness/sandbox.py). Never in the
worker, nor in the web process: importing a module runs its code.

`check_target` is lint's question (`oz0agents.harness_lint`): does the target import, in such a
child, and name an agent of its framework? It is answered by the bridge itself (`--check`), so
what lint accepts is what the worker can load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oz0agents.harness_programs import agent_path, module_allowed, module_prefixes
from runs.worker.harness.base import HarnessSession, HarnessUnavailable
from runs.worker.harness.jsonl import PROTOCOL, UNAVAILABLE_EXIT, converse
from runs.worker.harness.sandbox import SandboxUnavailable, confine

HERE = Path(__file__).parent
BRIDGES = {"pydantic_ai": HERE / "pydantic_ai_bridge.py", "openai_agents": HERE / "openai_agents_bridge.py"}
# What every bridge imports from beside itself (standard library only), mounted with it.
BRIDGE_LOADING = HERE / "bridge_loading.py"
# The SDK would send its traces to OpenAI's servers; an oz0 job's trace is oz0's.
BRIDGE_ENV = {"OPENAI_AGENTS_DISABLE_TRACING": "1"}
CHECK_SECONDS = 60.0
CHECK_KEPT_SECONDS = 600.0


@dataclass(frozen=True)
class TargetCheck:
    ok: bool | None  # None: it could not be checked here
    detail: str = ""


def target_refusal(target: str) -> str | None:
    """Why the installer does not allow this target's module, or None."""
    module = target.partition(":")[0]
    if module_allowed(module):
        return None
    allowed = ", ".join(module_prefixes()) or "none"
    return (
        f"module {module!r} is not under a prefix the installer allows in OZ0_HARNESS_MODULES "
        f"(allowed here: {allowed}); the installer adds it there"
    )


def bridge_command(kind: str, *args: str) -> tuple[list[str], dict[str, str], list[Path]]:
    """The bridge's argv, its environment and the folders it reads: its own file and the folders
    agent modules are found in (the installed packages come with the interpreter), and the
    loading the bridges share."""
    bridge = BRIDGES[kind]
    folders = [p for p in agent_path() if p.is_dir()]
    env = {**BRIDGE_ENV, "OZ0_AGENT_PATH": os.pathsep.join(str(p) for p in folders)}
    return [sys.executable, str(bridge), *args], env, [bridge, BRIDGE_LOADING, *folders]


_checked: dict[tuple[str, str, tuple[Path, ...]], tuple[float, frozenset[str]]] = {}


def check_target(kind: str, target: str) -> TargetCheck:
    """Import the target's module in a confined bridge and check it names an agent of `kind`'s
    framework. A module that imported lately is not imported again for its other agents."""
    module, _, attribute = target.partition(":")
    key = (kind, module, tuple(agent_path()))
    seen = _checked.get(key)
    if seen is not None and time.monotonic() - seen[0] < CHECK_KEPT_SECONDS and attribute in seen[1]:
        return TargetCheck(True)
    argv, env, reads = bridge_command(kind, "--check", target)
    try:
        confined = confine(argv, env, reads=reads, label="check")
    except SandboxUnavailable as error:
        return TargetCheck(None, f"could not be checked here: {error}")
    try:
        done = subprocess.run(
            confined.argv,
            env=confined.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=CHECK_SECONDS,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired:
        return TargetCheck(None, f"could not be checked here: importing it took longer than {CHECK_SECONDS:.0f} s")
    except OSError as error:
        return TargetCheck(None, f"could not be checked here: {error.strerror or error}")
    finally:
        confined.cleanup()
    said = done.stderr.decode("utf-8", "replace").strip().splitlines()
    if done.returncode == UNAVAILABLE_EXIT:
        return TargetCheck(False, (said[-1] if said else "it cannot be loaded")[:500])
    if done.returncode != 0:
        return TargetCheck(
            None, f"could not be checked here: the check exited with code {done.returncode}: {' | '.join(said[-2:])[:500]}"
        )
    try:
        agents = frozenset(json.loads(done.stdout.decode().strip().splitlines()[-1])["agents"])
    except (ValueError, KeyError, IndexError, TypeError):
        agents = frozenset()
    _checked[key] = (time.monotonic(), agents | {attribute})
    return TargetCheck(True)


def run_bridge(session: HarnessSession, kind: str) -> Any:
    """Run the job with the bridge of `kind`'s framework, loading the target the manifest names."""
    target = str(session.harness.get("target"))
    refusal = target_refusal(target)
    if refusal is not None:
        raise HarnessUnavailable(f"the {kind} agent {target!r} is not allowed here: {refusal}")
    argv, env, reads = bridge_command(kind, target)
    # A bridge keeps its framework's state in checkpoints: waiting on a person, it may be parked.
    session.parks = True
    return converse(session, argv, env, reads=reads, protocol=PROTOCOL)
