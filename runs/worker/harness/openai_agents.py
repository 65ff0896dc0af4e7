"""The OpenAI Agents SDK harness (F7): `harness: {openai_agents: "package.module:agent"}` names an
`agents.Agent` under a module prefix the installer allows (OZ0_HARNESS_MODULES).

The SDK's package is named `agents`, like oz0's Django app, so the two never share an interpreter:
the worker starts `openai_agents_bridge.py` as a confined child process (runs/worker/harness/bridges.py),
which loads the SDK agent and speaks the JSON-lines protocol v1 to the worker (`jsonl.converse`).
Everything else is the JSON-lines harness's: registry tools and oz.ask through the approval stage
and the trace, oz.fail (the SDK tool `oz__fail`) into the kernel's one oz.fail entry, a tool with
`needs_approval` through the approval stage (`oz.approval`), a cancel line that cancels the streamed
run, then SIGTERM and SIGKILL, and the usage the SDK counted billed on the round task.
"""

from __future__ import annotations

from typing import Any

from runs.worker.harness.base import HarnessSession
from runs.worker.harness.bridges import run_bridge


def run(session: HarnessSession) -> Any:
    return run_bridge(session, "openai_agents")
