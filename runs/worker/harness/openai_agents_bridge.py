"""The OpenAI Agents SDK side of oz0's openai_agents harness: a child process of the worker that
loads the SDK agent a manifest names and speaks the JSON-lines protocol v1 (docs/harness-jsonl.md)
to the worker.

Why a process of its own: the SDK's package is named `agents`, as is oz0's Django app, so the two
cannot be imported into one interpreter. This script is never imported by oz0; it runs confined
(runs/worker/harness/sandbox.py) as `python openai_agents_bridge.py package.module:agent` with
oz0's own folders taken off its path and the folders of OZ0_AGENT_PATH put on it.

oz0's registry tools and `oz__ask` become SDK function tools whose calls go to oz0 as `call`s;
`oz__fail` (offered when the manifest lists oz.fail) sends oz.fail and ends the run (its exception
surfaces: failure_error_function=None). A tool of the agent's own with `needs_approval` pauses the
SDK's run: its `RunState` goes to oz0 as a `checkpoint`, each interruption as `oz.approval`, and
the run resumes from its state with the call approved, or rejected with the failure's label as the
rejection message the model reads. A session started again (a retry, or a session resumed after
oz0 parked it while it waited on a person) goes on from the last such state. A `cancel` line
cancels the streamed run (`RunResultStreaming.cancel()`). Exit code 69 says the agent cannot be
loaded (the worker reports `harness_unavailable`). `--check package.module:agent` only loads it
(lint's question) and prints the module's agents. Each model request is reported to oz0 as it ends
(a `usage` line from the run hooks' `on_llm_end`, or as the run crashes): a `provider_call` event
of the round, its tokens billed however the job ends.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import queue
import sys
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
# Before the cut below: the loading shared with the other bridge lives beside this file.
from bridge_loading import load_agent  # noqa: E402

sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") not in (HERE, ROOT)]
sys.path[:0] = [*filter(None, os.environ.get("OZ0_AGENT_PATH", "").split(os.pathsep))]
# The protocol keeps stdout to itself: it goes on a descriptor of its own, and whatever the agent's
# code prints (to stdout, or fd 1) lands on stderr with its logs.
_protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
os.dup2(2, 1)
sys.stdout = sys.stderr

_out = threading.Lock()


def send(message: dict[str, Any]) -> None:
    with _out:
        _protocol.write(json.dumps(message) + "\n")
        _protocol.flush()


class Canceled(Exception):
    pass


class JobEnded(Exception):
    """oz.fail went to oz0, which ends the job."""


class Inbox:
    """Reads oz0's lines in a thread: results for the waiting call, and `cancel`, which must reach
    the run while a model call is in flight."""

    def __init__(self) -> None:
        self.results: queue.Queue[dict[str, Any]] = queue.Queue()
        self.canceled = threading.Event()
        self.on_cancel: Any = None
        self.start: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for line in sys.stdin:
                message = json.loads(line)
                if message.get("type") == "start":
                    self.start.put(message)
                elif message.get("type") == "result":
                    self.results.put(message)
                elif message.get("type") == "cancel":
                    print("oz0 canceled the run", file=sys.stderr, flush=True)
                    self._cancel()
        except (OSError, ValueError):
            pass
        self._cancel()  # oz0 closed our input: nobody waits for us any more

    def _cancel(self) -> None:
        self.canceled.set()
        if self.on_cancel is not None:
            self.on_cancel()


inbox: Inbox
_calls = threading.Lock()
_counter = [0]


def call(tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """One call to oz0, answered in order (protocol v1 has one call in flight)."""
    with _calls:
        _counter[0] += 1
        send({"type": "call", "id": _counter[0], "tool": tool, "args": args})
        while True:
            if inbox.canceled.is_set():
                raise Canceled()
            try:
                return inbox.results.get(timeout=0.05)
            except queue.Empty:
                continue


def as_tool_output(result: dict[str, Any]) -> str:
    if result.get("ok"):
        value = result.get("value")
        return value if isinstance(value, str) else json.dumps(value)
    return json.dumps(result.get("failure"))


def oz0_tools(start: dict[str, Any]) -> list[Any]:
    from agents import FunctionTool, function_tool  # the SDK, in this process

    def registry_tool(schema: dict[str, Any]) -> Any:
        async def invoke(context: Any, arguments: str) -> str:
            args = json.loads(arguments or "{}")
            return as_tool_output(await asyncio.to_thread(call, schema["name"], args))

        return FunctionTool(
            name=schema["name"].replace(".", "__"),
            description=schema.get("description") or schema["name"],
            params_json_schema=schema.get("parameters") or {"type": "object"},
            on_invoke_tool=invoke,
            strict_json_schema=False,
        )

    @function_tool(name_override="oz__fail", failure_error_function=None)
    def oz_fail(kind: str, message: str) -> str:
        """End the job in failure with one of your declared failure kinds and a message in your own words."""
        # Each model request's tokens went to oz0 as it ended (ModelCalls): the call carries none.
        send({"type": "call", "id": "oz.fail", "tool": "oz.fail", "args": {"kind": kind, "message": message}})
        raise JobEnded()

    @function_tool(name_override="oz__ask")
    async def oz_ask(question: str) -> str:
        """Ask a person a question and wait for the answer."""
        return as_tool_output(await asyncio.to_thread(call, "oz.ask", {"question": question}))

    # oz.fail is offered only when the agent lists it (F6): the start message's builtins say so.
    fail = [oz_fail] if "oz.fail" in start.get("builtins", []) else []
    return [*(registry_tool(schema) for schema in start.get("tools", [])), *fail, oz_ask]


def load(target: str) -> Any:
    return load_agent(
        target,
        framework="the OpenAI Agents SDK",
        agent_class=lambda: importlib.import_module("agents").Agent,
        expected="an agents.Agent",
    )


def prompt_of(start: dict[str, Any]) -> str:
    job_input = start.get("input")
    if job_input is None:
        return "Begin."
    return job_input if isinstance(job_input, str) else json.dumps(job_input, sort_keys=True)


def arguments_of(item: Any) -> dict[str, Any]:
    """A paused call's arguments as an object (the SDK keeps the model's JSON text)."""
    raw = item.arguments
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {"arguments": raw}
    return value if isinstance(value, dict) else {"arguments": value}


async def drive(agent: Any, start: dict[str, Any]) -> Any:
    """The streamed run to its end; a run paused for approvals asks oz0 and resumes from its state.
    Each such state is a checkpoint (its `RunState`), and a session started again (a retry, or
    resumed after a park) goes on from the one oz0 hands back instead of running from the start."""
    from agents import Runner

    current = agent.clone(tools=[*agent.tools, *oz0_tools(start)])
    hooks = model_calls()
    loop = asyncio.get_running_loop()
    run_input: Any = prompt_of(start)
    state = await resumed_state(current, start)
    while True:
        if state is None:
            result = Runner.run_streamed(current, input=run_input, hooks=hooks)
            inbox.on_cancel = lambda result=result: loop.call_soon_threadsafe(result.cancel)
            if inbox.canceled.is_set():
                result.cancel()
            async for _ in result.stream_events():
                pass
            if not result.interruptions or inbox.canceled.is_set():
                return result
            state = result.to_state()
            checkpoint(state)
        for item in state.get_interruptions():
            asked = {"tool": item.tool_name or "", "args": arguments_of(item)}
            answer = await asyncio.to_thread(call, "oz.approval", asked)
            if answer.get("ok"):
                state.approve(item)
            else:
                state.reject(item, rejection_message=as_tool_output(answer))
        run_input, state = state, None


def checkpoint(state: Any) -> None:
    """The run's state at an interruption (the only place the SDK makes one), kept by oz0 before
    the approvals it waits on are asked (protocol 2's `checkpoint`)."""
    try:
        saved = state.to_json()
    except Exception as error:  # a context the SDK cannot serialise: no checkpoint, nothing lost
        print(f"the run's state cannot be kept: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        return
    send({"type": "checkpoint", "state": {"openai_agents_state": saved}})


async def resumed_state(agent: Any, start: dict[str, Any]) -> Any:
    """The `RunState` of the checkpoint oz0 hands back (`start.resume`), or None: the run then
    starts from its prompt. Said to oz0 (`resumed`), which walks its journal from there."""
    from agents import RunState

    resume = start.get("resume")
    saved = resume.get("state", {}).get("openai_agents_state") if isinstance(resume, dict) else None
    if not isinstance(saved, dict):
        return None
    try:
        state = await RunState.from_json(agent, saved)
    except Exception as error:  # another SDK's schema, a changed agent: start over
        print(f"the checkpoint cannot be read, starting over: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        return None
    send({"type": "resumed"})
    return state


def model_calls() -> Any:
    """Run hooks that report each model request to oz0 as it ends (a `usage` line: model,
    provider, tokens, duration, finish): the round's trace shows every request, and its tokens are
    billed however the job ends. A request that raised is reported by `report_unfinished_calls`.
    (The SDK's tracing processors would see only the spans its OpenAI models make, and tracing is
    off here: OPENAI_AGENTS_DISABLE_TRACING. The run hooks see every model, a test's fake too.)"""
    from agents import RunHooks

    class ModelCalls(RunHooks[Any]):  # type: ignore[misc]
        async def on_llm_start(self, context: Any, agent: Any, system_prompt: Any, input_items: Any) -> None:
            _unfinished[id(agent)] = (agent, time.monotonic())

        async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
            _, started = _unfinished.pop(id(agent), (agent, 0.0))
            model, provider = model_of(agent)
            calls = [item for item in response.output if getattr(item, "type", None) == "function_call"]
            report_model_call(
                model=model,
                provider=provider,
                usage={"input_tokens": response.usage.input_tokens, "output_tokens": response.usage.output_tokens},
                started=started,
                # The SDK's response keeps no finish reason: whether the model asked for tools says it.
                finish="tool_calls" if calls else "stop",
            )

    return ModelCalls()


# The model requests begun and not ended, by agent: a request that raised ends no other way.
_unfinished: dict[int, tuple[Any, float]] = {}


def report_unfinished_calls(error: BaseException) -> None:
    for agent, started in list(_unfinished.values()):
        model, provider = model_of(agent)
        report_model_call(
            model=model,
            provider=provider,
            usage={"input_tokens": 0, "output_tokens": 0},
            started=started,
            exception=type(error).__name__,
        )
    _unfinished.clear()


def model_of(agent: Any) -> tuple[str | None, str | None]:
    """The model an agent ran on and its provider, as far as the SDK says: a model named by text is
    the default provider's (OpenAI's) unless it names another (`litellm/anthropic/...`); an agent
    that names none runs on the SDK's default model."""
    model = agent.model
    if model is None:
        from agents.models.default_models import get_default_model

        model = get_default_model()
    if isinstance(model, str):
        return model, "openai" if "/" not in model else None
    name = getattr(model, "model", None)
    provider = "openai" if type(model).__name__.startswith("OpenAI") else None
    return (name if isinstance(name, str) else type(model).__name__), provider


def report_model_call(
    *,
    model: Any,
    provider: Any,
    usage: dict[str, int],
    started: float,
    finish: Any = None,
    exception: str | None = None,
) -> None:
    """One model request, as a `usage` line (docs/harness-jsonl.md): oz0 bills it and traces it."""
    message: dict[str, Any] = {
        "type": "usage",
        "usage": {**usage, "requests": 1},
        "model": model if isinstance(model, str) else None,
        "provider": provider if isinstance(provider, str) else None,
        "duration_ms": max(0, round((time.monotonic() - started) * 1000)) if started else None,
        "finish": finish if isinstance(finish, str) else None,
    }
    if exception is not None:
        message.update(outcome="error", exception=exception)
    send(message)


def check(target: str) -> None:
    """Lint's question: load the target (exit 69 when it cannot be), then name the module's agents."""
    from agents import Agent

    load(target)
    module = sys.modules[target.partition(":")[0]]
    send({"agents": sorted(name for name, value in vars(module).items() if isinstance(value, Agent))})


def main() -> None:
    global inbox
    if sys.argv[1] == "--check":
        check(sys.argv[2])
        return
    agent = load(sys.argv[1])
    inbox = Inbox()
    try:
        start = inbox.start.get(timeout=60)
    except queue.Empty:
        sys.exit("oz0 sent no start")
    try:
        result = asyncio.run(drive(agent, start))
    except BaseException as error:
        if isinstance(error, JobEnded) or _caused_by(error, JobEnded):
            return
        if inbox.canceled.is_set() or _caused_by(error, Canceled):
            return
        report_unfinished_calls(error)  # each ended model request was billed as it ended
        raise
    if inbox.canceled.is_set():
        return
    output = result.final_output
    if hasattr(output, "model_dump"):
        output = output.model_dump(mode="json")
    send({"type": "done", "output": output})  # its tokens went with each model request


def _caused_by(error: BaseException, wanted: type[BaseException]) -> bool:
    seen: set[int] = set()
    stack = [error]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, wanted):
            return True
        stack.extend(e for e in (current.__cause__, current.__context__) if e is not None)
        stack.extend(getattr(current, "exceptions", ()) or ())
    return False


if __name__ == "__main__":
    main()
