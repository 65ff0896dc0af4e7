"""Pydantic AI agents on FunctionModel for the pydantic_ai harness's offline tests. The harness's
bridge process loads them (`oz0_test_pydantic_agents:<name>`, with this folder on OZ0_AGENT_PATH);
they run there, not in the test's process, so what a test reads of them is their answer, their
stderr, or a record in the folder the suite lets harnesses write (OZ0_HARNESS_WRITABLE)."""

from __future__ import annotations

import asyncio
import json
import os
import time

from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

SLOW_RECORD = os.path.join(os.environ.get("OZ0_HARNESS_WRITABLE", "/tmp").split(",")[0], "pydantic-slow.json")


def _record(what: str) -> None:
    seen = {}
    if os.path.exists(SLOW_RECORD):
        with open(SLOW_RECORD) as previous:
            seen = json.load(previous)
    with open(SLOW_RECORD, "w") as record:
        json.dump({**seen, what: time.time()}, record)


def _fails_with(kind: str, message: str) -> Agent[None, str]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
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


def _lists_tools(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return ModelResponse(parts=[TextPart(json.dumps(sorted(t.name for t in info.function_tools)))])


lists_tools = Agent(FunctionModel(_lists_tools))


async def _slow_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    _record("started")
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        _record("canceled")
        raise
    return ModelResponse(parts=[TextPart("too late")])


slow = Agent(FunctionModel(_slow_model))


def _broken_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    raise RuntimeError("the model exploded")


broken = Agent(FunctionModel(_broken_model))

not_an_agent = 42


# A tool of the agent's own that needs a person's approval (Pydantic AI's deferred tools): the
# model calls it, then answers with what the tool returned, or with the denial it was handed.
def _approval_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returned = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if returned:
        return ModelResponse(parts=[TextPart(f"the tool said: {returned[-1].content}")])
    return ModelResponse(parts=[ToolCallPart("delete_branch", {"branch": "release-1.2"}, tool_call_id="d1")])


approves = Agent(FunctionModel(_approval_model))


@approves.tool(requires_approval=True)
def delete_branch(ctx: RunContext[None], branch: str) -> str:
    print(f"delete_branch ran for {branch}", flush=True, file=__import__("sys").stderr)
    return f"deleted {branch}"


def _whereabouts(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    seen = {"pid": os.getpid(), "uid": os.getuid(), "cwd": os.getcwd(), "env": sorted(os.environ)}
    return ModelResponse(parts=[TextPart(json.dumps(seen))])


whereabouts = Agent(FunctionModel(_whereabouts))


def _exits(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    os._exit(7)


exits = Agent(FunctionModel(_exits))

BLOCKING_RECORD = os.path.join(os.path.dirname(SLOW_RECORD), "pydantic-blocking.json")


def _blocking_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returned = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if returned:
        return ModelResponse(parts=[TextPart("too late")])
    return ModelResponse(parts=[ToolCallPart("wait_for_the_mainframe", {})])


blocks = Agent(FunctionModel(_blocking_model))


@blocks.tool_plain
def wait_for_the_mainframe() -> str:
    """A tool of the agent's own that blocks (a slow network call), out of the framework's reach."""
    with open(BLOCKING_RECORD, "w") as record:
        json.dump({"started": time.time()}, record)
    time.sleep(60)
    with open(BLOCKING_RECORD, "w") as record:
        json.dump({"started": 0, "finished": time.time()}, record)
    return "done"


def _chatty(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    print("a print on stdout, which the protocol keeps to itself")
    os.write(1, b"and a write on descriptor 1\n")
    return ModelResponse(parts=[TextPart("said my piece")])


chatty = Agent(FunctionModel(_chatty))


def _crashes_after_a_call(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
        raise RuntimeError("the model fell over")
    return ModelResponse(parts=[ToolCallPart("test__echo", {"value": 1})], usage=RequestUsage(input_tokens=11, output_tokens=5))


crashes_after_a_call = Agent(FunctionModel(_crashes_after_a_call))


def _fails_after_a_call(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
        return ModelResponse(
            parts=[ToolCallPart("oz__fail", {"kind": "not_found", "message": "gone"})],
            usage=RequestUsage(input_tokens=7, output_tokens=2),
        )
    return ModelResponse(parts=[ToolCallPart("test__echo", {"value": 1})], usage=RequestUsage(input_tokens=11, output_tokens=5))


fails_after_a_call = Agent(FunctionModel(_fails_after_a_call))


def _job(messages: list[ModelMessage]) -> dict[str, str]:
    """The run's input, which the bridge sends as the prompt: `{effect, marker, asked}`."""
    return json.loads(next(str(p.content) for m in messages for p in m.parts if isinstance(p, UserPromptPart)))


def _effect_then_crash_once(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Makes test.effect, then crashes after its answer unless the marker says it already did once."""
    job = _job(messages)
    with open(job["asked"], "a") as asked:  # how often the model was asked, in all sessions
        asked.write("asked\n")
    returned = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if not returned:
        return ModelResponse(parts=[ToolCallPart("test__effect", {"id": job["effect"]})])
    if not os.path.exists(job["marker"]):
        open(job["marker"], "w").close()  # noqa: SIM115
        os._exit(3)
    return ModelResponse(parts=[TextPart(f"made {json.dumps(returned[-1].content)}")])


effect_then_crash_once = Agent(FunctionModel(_effect_then_crash_once))


# Model calls in the trace (issue 29): a model that spends tokens, then ends the job with oz.fail;
# and one that spends tokens on a tool call, then raises (the bridge crashes).
def _spends_then_fails(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returned = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if returned:
        return ModelResponse(
            parts=[ToolCallPart("oz__fail", {"kind": "not_found", "message": "no such issue"})],
            usage=RequestUsage(input_tokens=40, output_tokens=9),
        )
    return ModelResponse(
        parts=[ToolCallPart("test__echo", {"value": "looked"})], usage=RequestUsage(input_tokens=30, output_tokens=6)
    )


spends_then_fails = Agent(FunctionModel(_spends_then_fails))


def _spends_then_crashes(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
        raise RuntimeError("the model exploded after spending")
    return ModelResponse(
        parts=[ToolCallPart("test__echo", {"value": "looked"})], usage=RequestUsage(input_tokens=25, output_tokens=5)
    )


spends_then_crashes = Agent(FunctionModel(_spends_then_crashes))


# Waits hold nothing (issue 29): a tool of its own that needs approval, whose effect is a line in
# the job's `effects` file; the model notes each time it is asked in the job's `asked` file.
def _ships(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    job = _job(messages)
    with open(job["asked"], "a") as asked:
        asked.write("asked\n")
    returned = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    usage = RequestUsage(input_tokens=11, output_tokens=2)
    if returned:
        return ModelResponse(parts=[TextPart(f"the tool said: {returned[-1].content}")], usage=usage)
    return ModelResponse(
        parts=[ToolCallPart("ship", {"version": "1.2", "record": job["effects"]}, tool_call_id="s1")], usage=usage
    )


parks = Agent(FunctionModel(_ships))


@parks.tool_plain(requires_approval=True)
def ship(version: str, record: str) -> str:
    with open(record, "a") as effects:
        effects.write(f"shipped {version}\n")
    return f"shipped {version}"


def _asks_then_ships(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Asks a person which version, then answers with it (a wait on oz.ask)."""
    job = _job(messages)
    with open(job["asked"], "a") as asked:
        asked.write("asked\n")
    returned = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if returned:
        return ModelResponse(parts=[TextPart(f"answered: {returned[-1].content}")])
    return ModelResponse(parts=[ToolCallPart("oz__ask", {"question": "Which version?"})])


asks_and_parks = Agent(FunctionModel(_asks_then_ships))
