"""Pydantic AI agents on FunctionModel for the pydantic_ai harness's offline tests, named in their
manifests as `tests.harness.pydantic_agents:<name>`. They run in the test's process (the worker's
thread), so what they saw is kept here for the tests to read."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

SEEN: dict[str, Any] = {}


def _fails_with(kind: str, message: str) -> Agent[None, str]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        SEEN["tools"] = sorted(t.name for t in info.function_tools)
        return ModelResponse(parts=[ToolCallPart("oz__fail", {"kind": kind, "message": message})])

    return Agent(FunctionModel(model))


declared = _fails_with("not_found", "issue 9 is not in the tracker")
undeclared = _fails_with("gone_fishing", "bye")
too_long = _fails_with("not_found", "x" * 2001)


def _echo_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returned = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if returned:
        return ModelResponse(
            parts=[TextPart(json.dumps(returned[-1].content))], usage=RequestUsage(input_tokens=20, output_tokens=4)
        )
    return ModelResponse(
        parts=[ToolCallPart("test__echo", {"value": {"said": "hello"}})], usage=RequestUsage(input_tokens=10, output_tokens=3)
    )


echo = Agent(FunctionModel(_echo_model))


def _ask_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returned = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if returned:
        return ModelResponse(parts=[TextPart(f"answered: {returned[-1].content}")])
    return ModelResponse(parts=[ToolCallPart("oz__ask", {"question": "Which repo?"})])


asks = Agent(FunctionModel(_ask_model))


async def _slow_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    SEEN["slow_started"] = time.time()
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        SEEN["slow_canceled"] = time.time()
        raise
    return ModelResponse(parts=[TextPart("too late")])


slow = Agent(FunctionModel(_slow_model))


def _broken_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    raise RuntimeError("the model exploded")


broken = Agent(FunctionModel(_broken_model))

not_an_agent = 42
