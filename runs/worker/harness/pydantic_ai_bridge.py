"""The Pydantic AI side of oz0's pydantic_ai harness: a child process of the worker that loads the
Agent a manifest names and speaks the JSON-lines protocol v1 (docs/harness-jsonl.md) to the worker.

Never imported by oz0; it runs confined (runs/worker/harness/sandbox.py) as
`python pydantic_ai_bridge.py package.module:agent`, with oz0's own folders taken off its path (this
folder holds `pydantic_ai.py`, the worker's adapter) and the folders of OZ0_AGENT_PATH put on it.
Running the agent here, not in the worker, means a crash ends only this process, changed code is
loaded at the next round, and a cancel reaches the run even while one of its tools blocks.

The run gets a toolset of oz0's: each registry tool the job lists (by its wire name, `clock.now` as
`clock__now`), `oz__ask`, and (when the manifest lists oz.fail) `oz__fail`, which sends oz.fail and ends the run. A tool of the
agent's own that `requires_approval` (or raises `ApprovalRequired`) is resolved during the run by a
`HandleDeferredToolCalls` capability: each call goes to oz0 as `oz.approval`, and the answer comes
back as Pydantic AI's own approval, or a `ToolDenied` whose message is the failure's label. A
`cancel` line fires the run's `CancellationToken`. Exit code 69 says the agent cannot be loaded (the
worker reports `harness_unavailable`). `--check package.module:agent` only loads it (lint's
question) and prints the module's agents. Each model request is reported to oz0 as it ends (a
`usage` line from a capability's `after_model_request` / `on_model_request_error` hooks): a
`provider_call` event of the round, its tokens billed however the job ends.
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
from dataclasses import dataclass
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

FAIL_DESCRIPTION = (
    "End the job in failure with one of your declared failure kinds and a message in your own words "
    "(at most 2,000 characters). Use it only when the job cannot be done."
)
ASK_DESCRIPTION = "Ask a person a question and wait for the answer."

_out = threading.Lock()
_calls = threading.Lock()
_counter = [0]


class Canceled(Exception):
    pass


class JobEnded(Exception):
    """oz.fail went to oz0, which ends the job."""


def send(message: dict[str, Any]) -> None:
    with _out:
        _protocol.write(json.dumps(message) + "\n")
        _protocol.flush()


class Inbox:
    """Reads oz0's lines in a thread: the start, results for the waiting call, and `cancel`,
    which must reach the run while a model request or a tool is in flight."""

    def __init__(self) -> None:
        self.start: queue.Queue[dict[str, Any]] = queue.Queue()
        self.results: queue.Queue[dict[str, Any]] = queue.Queue()
        self.canceled = threading.Event()
        self.token: Any = None
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
        if self.token is not None:
            self.token.cancel()


inbox: Inbox


def call(tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """One call to oz0, answered in order (protocol v1 has one call in flight)."""
    with _calls:
        checkpoint()
        _counter[0] += 1
        send({"type": "call", "id": _counter[0], "tool": tool, "args": args})
        while True:
            if inbox.canceled.is_set():
                raise Canceled()
            try:
                return inbox.results.get(timeout=0.05)
            except queue.Empty:
                continue


def answer_of(result: dict[str, Any]) -> Any:
    """What a tool answers the model: the value, or the failure labelled with whose words it is."""
    return result.get("value") if result.get("ok") else result.get("failure")


def as_text(result: dict[str, Any]) -> str:
    value = answer_of(result)
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def load(target: str) -> Any:
    return load_agent(
        target,
        framework="the Pydantic AI",
        agent_class=lambda: importlib.import_module("pydantic_ai").Agent,
        expected="a pydantic_ai.Agent",
    )


def toolset(start: dict[str, Any]) -> Any:
    from pydantic_ai import FunctionToolset, Tool

    def oz_fail(kind: str, message: str) -> None:
        # Each model request's tokens went to oz0 as it ended (ModelCalls): the call carries none.
        send({"type": "call", "id": "oz.fail", "tool": "oz.fail", "args": {"kind": kind, "message": message}})
        raise JobEnded()

    def oz_ask(question: str) -> Any:
        return answer_of(call("oz.ask", {"question": question}))

    def registry_tool(name: str) -> Any:
        def invoke(**args: Any) -> Any:
            return answer_of(call(name, args))

        invoke.__name__ = name.replace(".", "__")
        return invoke

    tools: list[Any] = [Tool(oz_ask, name="oz__ask", description=ASK_DESCRIPTION)]
    if "oz.fail" in start.get("builtins", []):  # F6: oz.fail is the agent's only when its tools list it
        tools.append(Tool(oz_fail, name="oz__fail", description=FAIL_DESCRIPTION))
    for schema in start.get("tools", []):
        tools.append(
            Tool.from_schema(
                registry_tool(schema["name"]),
                name=schema["name"].replace(".", "__"),
                description=schema.get("description") or schema["name"],
                json_schema=schema.get("parameters") or {"type": "object"},
            )
        )
    return FunctionToolset(tools)


async def approvals(ctx: Any, requests: Any) -> Any:
    """Tools of the agent's own waiting for approval: oz0's approval stage decides each."""
    from pydantic_ai import DeferredToolResults, ToolDenied

    decided: dict[str, Any] = {}
    for part in requests.approvals:
        answer = await asyncio.to_thread(call, "oz.approval", {"tool": part.tool_name, "args": part.args_as_dict()})
        decided[part.tool_call_id] = True if answer.get("ok") else ToolDenied(as_text(answer))
    return DeferredToolResults(approvals=decided) if decided else None


async def drive(agent: Any, start: dict[str, Any]) -> Any:
    from pydantic_ai import CancellationToken, DeferredToolRequests, capture_run_messages
    from pydantic_ai.capabilities import HandleDeferredToolCalls

    inbox.token = CancellationToken()
    if inbox.canceled.is_set():
        inbox.token.cancel()
    prompt = start.get("input")
    if prompt is None:
        prompt = "Begin."
    elif not isinstance(prompt, str):
        prompt = json.dumps(prompt, sort_keys=True)
    history = resumed_history(start)
    with capture_run_messages() as messages:
        _captured.append(messages)
        result = await agent.run(
            None if history else prompt,
            message_history=history,
            toolsets=[toolset(start)],
            instructions=str(start.get("instructions") or "") or None,
            cancellation_token=inbox.token,
            capabilities=[HandleDeferredToolCalls(handler=approvals), model_calls()],
        )
    if isinstance(result.output, DeferredToolRequests):
        names = sorted({part.tool_name for part in result.output.calls})
        sys.exit(f"the agent left calls to be run outside it ({', '.join(names)}), which oz0 does not run")
    return result


def resumed_history(start: dict[str, Any]) -> list[Any] | None:
    """The messages of the checkpoint oz0 hands back (`start.resume`) when the round's session started
    before: the run goes on from them (its pending tool calls answered from the journal) instead of
    asking its model again. Said to oz0 (`resumed`), which then walks its journal from there."""
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    resume = start.get("resume")
    messages = resume.get("state", {}).get("pydantic_ai_messages") if isinstance(resume, dict) else None
    if not messages:
        return None
    try:
        history = ModelMessagesTypeAdapter.validate_python(messages)
    except ValueError as error:
        print(f"the checkpoint cannot be read, starting over: {error}", file=sys.stderr, flush=True)
        return None
    _checkpointed[0] = len(history)
    send({"type": "resumed"})
    return history


# How many of the run's messages the last checkpoint held.
_checkpointed = [0]


def checkpoint() -> None:
    """Before a call to oz0, the run's messages up to the model response that made it (once per
    response): a session started again resumes from them (protocol 2's `checkpoint`)."""
    from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelResponse

    messages = list(_captured[-1]) if _captured else []
    while messages and not isinstance(messages[-1], ModelResponse):
        messages.pop()
    if len(messages) <= _checkpointed[0]:
        return
    _checkpointed[0] = len(messages)
    state = {"pydantic_ai_messages": ModelMessagesTypeAdapter.dump_python(messages, mode="json")}
    send({"type": "checkpoint", "state": state})


# The run's messages as Pydantic AI captures them: what a checkpoint holds.
_captured: list[list[Any]] = []


def model_calls() -> Any:
    """A capability that reports each model request of the run to oz0 as it ends (a `usage` line:
    model, provider, tokens, duration, finish), or as it fails: the round's trace shows every
    request and its tokens are billed however the job ends (oz.fail, a crash, a cancel)."""
    from pydantic_ai.capabilities import AbstractCapability

    @dataclass
    class ModelCalls(AbstractCapability[Any]):
        started: float = 0.0

        async def prepare_model_request(self, ctx: Any, request_context: Any) -> Any:
            self.started = time.monotonic()  # before each attempt, once the serving model is known
            return request_context

        async def after_model_request(self, ctx: Any, *, request_context: Any, response: Any) -> Any:
            model = getattr(request_context, "model", None)
            report_model_call(
                model=response.model_name or getattr(model, "model_name", None),
                provider=response.provider_name or getattr(model, "system", None),
                usage={"input_tokens": response.usage.input_tokens or 0, "output_tokens": response.usage.output_tokens or 0},
                started=self.started,
                finish=response.finish_reason,
            )
            return response

        async def on_model_request_error(self, ctx: Any, *, request_context: Any, error: Exception) -> Any:
            model = getattr(request_context, "model", None)
            report_model_call(
                model=getattr(model, "model_name", None),
                provider=getattr(model, "system", None),
                usage={"input_tokens": 0, "output_tokens": 0},
                started=self.started,
                exception=type(error).__name__,
            )
            raise error

    return ModelCalls()


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
    from pydantic_ai import Agent

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
        if _caused_by(error, JobEnded) or inbox.canceled.is_set() or _caused_by(error, Canceled):
            return
        raise  # each model request was billed as it ended
    if inbox.canceled.is_set():
        return
    output = result.output
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
