"""The OpenAI Agents SDK harness (F7): `harness: {openai_agents: "package.module:agent"}` names an
`agents.Agent`.

The SDK's package is named `agents`, like oz0's Django app, so the two never share an interpreter:
the worker starts `openai_agents_bridge.py` as a child process, which loads the SDK agent and speaks
the JSON-lines protocol v1 to the worker (`jsonl.converse`). Everything else is the JSON-lines
harness's: registry tools and oz.ask through the approval stage and the trace, oz.fail (the SDK tool
`oz__fail`) into the kernel's one oz.fail entry, a cancel line that cancels the streamed run, then
SIGTERM and SIGKILL, and the usage the SDK counted billed on the round task.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from runs.worker.harness.base import HarnessSession
from runs.worker.harness.jsonl import converse

BRIDGE = Path(__file__).with_name("openai_agents_bridge.py")
# The SDK would send its traces to OpenAI's servers; an oz0 job's trace is oz0's.
BRIDGE_ENV = {"OPENAI_AGENTS_DISABLE_TRACING": "1"}


def run(session: HarnessSession) -> Any:
    target = str(session.harness.get("target"))
    # Where the bridge looks for agent modules besides the installed packages and agents/examples/.
    env = {**BRIDGE_ENV, "OZ0_AGENT_PATH": os.environ.get("OZ0_AGENT_PATH", "")}
    return converse(session, [sys.executable, str(BRIDGE), target], env)
