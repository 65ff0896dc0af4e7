"""The Pydantic AI harness (F7): `harness: {pydantic_ai: "package.module:agent"}` names an `Agent`
under a module prefix the installer allows (OZ0_HARNESS_MODULES).

The agent runs in a confined child process, `pydantic_ai_bridge.py` (runs/worker/harness/bridges.py),
never in the worker: a crash takes down only the child, changed code is loaded at the next round,
and a cancel reaches the run even while a tool blocks. The bridge speaks the JSON-lines protocol v1
to the worker (`jsonl.converse`) and adds a toolset of oz0's: each registry tool the manifest lists
(by its wire name, `clock.now` as `clock__now`), `oz__ask`, and `oz__fail`, which ends the job with
the agent's kind through the kernel (F6). A tool that `requires_approval` crosses the approval stage
(`oz.approval`), its decision handed back as Pydantic AI's own approval or `ToolDenied`. A run cancel
fires the run's `CancellationToken`. The tokens the run reports are billed on the round task.
"""

from __future__ import annotations

from typing import Any

from runs.worker.harness.base import HarnessSession
from runs.worker.harness.bridges import run_bridge


def run(session: HarnessSession) -> Any:
    return run_bridge(session, "pydantic_ai")
