"""The Pydantic AI harness (F7): `harness: {pydantic_ai: "package.module:agent"}` names an `Agent`.

oz0 runs it with `run_sync`, adding a toolset of its own: each registry tool the manifest lists (by
its wire name, `clock.now` as `clock__now`), `oz__ask`, and, when the manifest lists oz.fail,
`oz__fail`, which ends the job with the agent's kind through the kernel (F6). A run cancel fires the run's `CancellationToken`. The tokens
`run_sync` reports are billed on the round task.
"""

from __future__ import annotations

import threading
from typing import Any, NoReturn

from runs.worker.harness.base import (
    HarnessCanceled,
    HarnessCrashed,
    HarnessError,
    HarnessSession,
    HarnessUnavailable,
    JobEnded,
    OzFailCalled,
    found_in,
    load_target,
    wire_name,
)

try:
    from pydantic_ai import Agent, CancellationToken, FunctionToolset, RunCancelled, Tool
except ImportError as missing:  # the adapter loads; a job on it fails harness_unavailable
    raise ImportError(f"pydantic-ai-slim is not installed: {missing}") from None

FAIL_DESCRIPTION = (
    "End the job in failure with one of your declared failure kinds and a message in your own words "
    "(at most 2,000 characters). Use it only when the job cannot be done."
)
ASK_DESCRIPTION = "Ask a person a question and wait for the answer."


def toolset(session: HarnessSession) -> FunctionToolset[Any]:
    def oz_fail(kind: str, message: str) -> None:
        raise OzFailCalled(kind, message)

    def oz_ask(question: str) -> Any:
        return session.framework_ask(question)

    tools: list[Tool[Any]] = [Tool(oz_ask, name="oz__ask", description=ASK_DESCRIPTION)]
    if session.offers_fail:  # F6: oz.fail is the agent's only when its tools list it
        tools.append(Tool(oz_fail, name="oz__fail", description=FAIL_DESCRIPTION))
    for schema in session.tool_schemas():
        tools.append(
            Tool.from_schema(
                session.framework_tool(schema["name"]),
                name=wire_name(schema["name"]),
                description=schema["description"] or schema["name"],
                json_schema=schema["parameters"],
            )
        )
    return FunctionToolset(tools)


def run(session: HarnessSession) -> Any:
    agent = load_target(str(session.harness.get("target")), "pydantic_ai")
    if not isinstance(agent, Agent):
        raise HarnessUnavailable(f"{session.harness.get('target')!r} is a {type(agent).__name__}, not a pydantic_ai.Agent")
    token = CancellationToken()
    finished = threading.Event()

    def relay_cancel() -> None:
        while not finished.is_set():
            if session.cancel.wait(0.05):
                token.cancel()
                return

    relay = threading.Thread(target=relay_cancel, name="oz0-pydantic-ai-cancel", daemon=True)
    relay.start()
    instructions = str(session.manifest.get("instructions") or "") or None
    try:
        result = agent.run_sync(
            session.prompt(), toolsets=[toolset(session)], instructions=instructions, cancellation_token=token
        )
    except BaseException as error:
        _reraise(session, error)
    finally:
        finished.set()
        relay.join(timeout=1)
    usage = result.usage
    session.bill({"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens}, calls=usage.requests)
    output = result.output
    return output.model_dump(mode="json") if hasattr(output, "model_dump") else output


def _reraise(session: HarnessSession, error: BaseException) -> NoReturn:
    """What ended `run_sync` early, in oz0's words: oz.fail, a cancel, or the framework's failure."""
    fail = found_in(error, OzFailCalled)
    if isinstance(fail, OzFailCalled):
        session.fail(fail.kind, fail.message)  # raises JobEnded
    for ours in (JobEnded, HarnessCanceled, HarnessError):
        if (found := found_in(error, ours)) is not None:
            raise found from None
    if session.cancel.is_set() or found_in(error, RunCancelled) is not None:
        raise HarnessCanceled() from None
    if not isinstance(error, Exception):
        raise error
    raise HarnessCrashed(f"the Pydantic AI run failed: {type(error).__name__}: {error}"[:2000]) from None
