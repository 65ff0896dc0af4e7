"""A Pydantic AI agent that oz0 runs through its pydantic_ai harness (oz0agents/examples/pydantic-triage.yaml).

Its model is a `FunctionModel`, so the demo and the tests run offline: it reads the clock through oz0's
`clock__now` tool, then answers, or ends the job with `oz__fail(not_found, ...)` for issue 404. Swap in a
real model (`Agent("openai:gpt-4o-mini", ...)`) and nothing else changes: oz0 offers the same tools.
"""

from __future__ import annotations

import json

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel


def triage_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    prompt = next(str(p.content) for m in messages for p in m.parts if isinstance(p, UserPromptPart))
    returned = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if returned:
        return ModelResponse(parts=[TextPart(f"triaged; the clock said {json.dumps(returned[-1].content)}")])
    if '"issue": 404' in prompt:
        return ModelResponse(parts=[ToolCallPart("oz__fail", {"kind": "not_found", "message": "issue 404 does not exist"})])
    return ModelResponse(parts=[ToolCallPart("clock__now", {})])


agent = Agent(FunctionModel(triage_model), name="pydantic-triage", instructions="Triage the issue named in the input.")
