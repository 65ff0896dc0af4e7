"""OpenAI Agents SDK agents for the openai_agents harness's offline tests. The harness's bridge
process loads them (`oz0_test_sdk_agents:<name>`, with this folder on OZ0_AGENT_PATH), where
`agents` is the SDK; oz0's own processes never import this module."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from typing import Any

from agents import Agent, Model, Usage, function_tool
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call  # type: ignore[import-not-found]


def _fails_with(kind: str, message: str) -> Any:
    step = ModelStep(output=[function_call("oz__fail", {"kind": kind, "message": message}, call_id="f1")])
    return Agent(name="fails", model=ScriptedModel([step]))


declared = _fails_with("not_found", "issue 9 is not in the tracker")
undeclared = _fails_with("gone_fishing", "bye")
too_long = _fails_with("not_found", "x" * 2001)


def _last_output(call: Any) -> ModelStep:
    outputs = [item for item in call.input if isinstance(item, dict) and item.get("type") == "function_call_output"]
    return ModelStep(
        output=[assistant_message(str(outputs[-1]["output"]))], usage=Usage(requests=1, input_tokens=20, output_tokens=4)
    )


echo = Agent(
    name="echo",
    model=ScriptedModel(
        [
            ModelStep(
                output=[function_call("test__echo", {"value": {"said": "hello"}}, call_id="e1")],
                usage=Usage(requests=1, input_tokens=10, output_tokens=3),
            ),
            ModelStep.respond(_last_output),
        ]
    ),
)

asks = Agent(
    name="asks",
    model=ScriptedModel(
        [ModelStep(output=[function_call("oz__ask", {"question": "Which repo?"}, call_id="q1")]), ModelStep.respond(_last_output)]
    ),
)


# When the slow model's call began and when a cancel ended it (the test reads them; tests run one at
# a time), in the folder the suite lets every harness write (OZ0_HARNESS_WRITABLE).
SLOW_RECORD = os.path.join(os.environ.get("OZ0_HARNESS_WRITABLE", tempfile.gettempdir()).split(",")[0], "sdk-slow.json")


def _record(what: str) -> None:
    seen = {}
    if os.path.exists(SLOW_RECORD):
        with open(SLOW_RECORD) as previous:
            seen = json.load(previous)
    with open(SLOW_RECORD, "w") as record:
        json.dump({**seen, what: time.time()}, record)


class SlowModel(Model):  # type: ignore[misc]
    """A model call that takes 30 s, unless the run is canceled first."""

    async def get_response(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(30)

    async def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        _record("started")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            _record("canceled")
            raise
        yield json.dumps({})


slow = Agent(name="slow", model=SlowModel())
broken = Agent(name="broken", model=ScriptedModel([ModelStep.raise_error(RuntimeError("the model exploded"))]))
not_an_agent = 42


# A tool of the agent's own that needs approval (the SDK's `needs_approval`): the model calls it,
# then answers with what the tool returned, or with the rejection message it was handed.
@function_tool(needs_approval=True)
def delete_branch(branch: str) -> str:
    """Delete a branch of the repository."""
    import sys

    print(f"delete_branch ran for {branch}", file=sys.stderr, flush=True)
    return f"deleted {branch}"


approves = Agent(
    name="approves",
    tools=[delete_branch],
    model=ScriptedModel(
        [
            ModelStep(
                output=[function_call("delete_branch", {"branch": "release-1.2"}, call_id="d1")],
                usage=Usage(requests=1, input_tokens=10, output_tokens=3),
            ),
            ModelStep.respond(_last_output),
        ]
    ),
)


def _job(call: Any) -> dict[str, str]:
    """The run's input, which the bridge sends as the prompt: `{effect, marker}`."""
    items = call.input if isinstance(call.input, list) else [{"role": "user", "content": call.input}]
    return json.loads(next(str(i["content"]) for i in items if isinstance(i, dict) and i.get("role") == "user"))


def _make_the_effect(call: Any) -> ModelStep:
    return ModelStep(output=[function_call("test__effect", {"id": _job(call)["effect"]}, call_id="x1")])


def _crash_once_then_answer(call: Any) -> ModelStep:
    marker = _job(call)["marker"]
    if not os.path.exists(marker):
        open(marker, "w").close()  # noqa: SIM115
        os._exit(3)
    return _last_output(call)


effect_then_crash_once = Agent(
    name="effect_then_crash_once",
    model=ScriptedModel([ModelStep.respond(_make_the_effect), ModelStep.respond(_crash_once_then_answer)]),
)


# Model calls in the trace (issue 29): a model that spends tokens, then ends the job with oz.fail;
# and one that spends tokens on a tool call, then raises (the bridge crashes).
spends_then_fails = Agent(
    name="spends_then_fails",
    model=ScriptedModel(
        [
            ModelStep(
                output=[function_call("test__echo", {"value": "looked"}, call_id="e1")],
                usage=Usage(requests=1, input_tokens=30, output_tokens=6),
            ),
            ModelStep(
                output=[function_call("oz__fail", {"kind": "not_found", "message": "no such issue"}, call_id="f1")],
                usage=Usage(requests=1, input_tokens=40, output_tokens=9),
            ),
        ]
    ),
)
spends_then_crashes = Agent(
    name="spends_then_crashes",
    model=ScriptedModel(
        [
            ModelStep(
                output=[function_call("test__echo", {"value": "looked"}, call_id="e1")],
                usage=Usage(requests=1, input_tokens=25, output_tokens=5),
            ),
            ModelStep.raise_error(RuntimeError("the model exploded after spending")),
        ]
    ),
)


# Waits hold nothing (issue 29): a tool of its own that needs approval, whose effect is a line in
# the job's `effects` file; the model decides from what it is handed (not from a script's place,
# which a new process starts again), and notes each time it is asked in the job's `asked` file.
@function_tool(needs_approval=True)
def ship(version: str, record: str) -> str:
    """Ship a release."""
    with open(record, "a") as effects:
        effects.write(f"shipped {version}\n")
    return f"shipped {version}"


def _ships(call: Any) -> ModelStep:
    job = _job(call)
    with open(job["asked"], "a") as asked:
        asked.write("asked\n")
    outputs = [item for item in call.input if isinstance(item, dict) and item.get("type") == "function_call_output"]
    usage = Usage(requests=1, input_tokens=11, output_tokens=2)
    if outputs:
        return ModelStep(output=[assistant_message(f"the tool said: {outputs[-1]['output']}")], usage=usage)
    return ModelStep(output=[function_call("ship", {"version": "1.2", "record": job["effects"]}, call_id="s1")], usage=usage)


parks = Agent(name="parks", tools=[ship], model=ScriptedModel([ModelStep.respond(_ships) for _ in range(6)]))

# The same agent under another name, so a test may find its bridge process by its target.
parks_killed = parks
