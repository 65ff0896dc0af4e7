"""An OpenAI Agents SDK agent that oz0 runs through its openai_agents harness
(oz0agents/examples/openai-triage.yaml). It is loaded by the harness's bridge process, where `agents`
is the SDK (in oz0's own processes `agents` is oz0's Django app), as `openai_triage:agent`.

Its model is the SDK's offline `ScriptedModel`, answering from what the call holds: it reads the
clock through oz0's `clock__now` tool, then answers, or ends the job with `oz__fail(not_found, ...)`
for issue 404. Give it a real model (`model="gpt-4o-mini"`) and nothing else changes.
"""

from __future__ import annotations

import json
from typing import Any

from agents import Agent  # the SDK, in the bridge's interpreter
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call  # type: ignore[import-not-found]


def _step(call: Any) -> ModelStep:
    text = json.dumps(call.input, default=str)
    if '"function_call_output"' in text:
        return ModelStep(output=[assistant_message("triaged; the clock answered")])
    if '\\"issue\\": 404' in text or '"issue": 404' in text:
        return ModelStep(
            output=[function_call("oz__fail", {"kind": "not_found", "message": "issue 404 does not exist"}, call_id="f1")]
        )
    return ModelStep(output=[function_call("clock__now", {}, call_id="c1")])


agent = Agent(
    name="openai-triage",
    instructions="Read the clock, then triage the issue named in the input.",
    model=ScriptedModel([ModelStep.respond(_step) for _ in range(4)]),
)
