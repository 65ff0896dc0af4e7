"""What a model's answer does to the graph (S4-S9, S20, S23-S27): the kernel side of a round.

The worker (`runs.rounds`) calls the provider and reports here: a final answer, a fan of tool
calls (authored as `<round>.<n>` tasks the round then waits on), a question, oz.fail, a switch
to a fallback route, or a length refusal that arms a compaction. Each runs under the run's
row lock like every other transition.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from runs import failures
from runs.kernel.errors import InvalidRequest
from runs.kernel.transitions import (
    _after_failure,
    _claimed,
    _fail_claimed,
    _locked,
    _make_ready,
    _merge_result,
    _run_of,
    _wait_on,
    arm_compaction_in,
    fail_run,
    task_complete,
)
from runs.kernel.validation import TaskSpec, check_storable
from runs.models import AgentVersion, Run, TaskStatus

MAX_FAN_CALLS = 32
OZ_FAIL_MESSAGE_MAX = 2000


def round_answered(task_id: int, claim: str, text: str, *, extra: Mapping[str, Any], state: Mapping[str, Any]) -> bool:
    """The model gave its final answer: the round completes with the text as its value."""
    return task_complete(task_id, claim, text, extra=extra, state=state)


def round_expand(
    task_id: int,
    claim: str,
    calls: Sequence[Mapping[str, Any]],
    *,
    extra: Mapping[str, Any],
    state: Mapping[str, Any],
    allowed_tools: Sequence[str] | None,
    tool_policies: Mapping[str, str],
    tool_timeouts: Mapping[str, float] | None = None,
) -> bool:
    """Author the model's tool calls as a fan of `<round>.<n>` tool tasks; the round waits on
    them and runs again with their results (its next round)."""
    with _locked(_run_of(task_id), "model") as txn:
        task = _claimed(txn, task_id, claim)
        if task is None:
            return False
        fields: dict[str, Any] = {"result": _merge_result(txn, task, extra), "state": dict(state), "claim": None}
        refusal = _fan_refusal(calls, allowed_tools)
        if refusal is not None:
            key, detail = refusal
            fields["state"] = _without_refused_turn(fields["state"])
            _fail_claimed(txn, task, TaskStatus.FAILED, key, detail, {**fields, "finished_at": txn.now})
            return True
        counter = int(state.get("authored", 0))
        specs = []
        for call in calls:
            counter += 1
            name = str(call["tool"])
            spec: dict[str, Any] = {"tool": name, "args": dict(call.get("args") or {})}
            if (tool_timeouts or {}).get(name):
                spec["timeout_s"] = tool_timeouts[name]  # type: ignore[index]
            specs.append(
                TaskSpec(
                    key=f"{task.key}.{counter}",
                    kind="tool",
                    after=[],
                    on_failure=tool_policies.get(name, "absorb"),
                    spec=spec,
                    composed=True,
                    lineage=task.lineage,
                )
            )
        fields["state"] = {**fields["state"], "authored": counter}
        _wait_on(txn, task, specs, fields)
        return True


def _without_refused_turn(state: Mapping[str, Any]) -> dict[str, Any]:
    """A refused answer is not the conversation's last word: a re-run of the step asks the model
    again from where it stood, never from the assistant's own turn (missing_input)."""
    history = list(state.get("history", []))
    if history and history[-1].get("role") == "assistant":
        history.pop()
    return {**state, "history": history}


def _fan_refusal(calls: Sequence[Mapping[str, Any]], allowed: Sequence[str] | None) -> tuple[str, str] | None:
    from runs.tools import get_tool

    if len(calls) > MAX_FAN_CALLS:
        return "too_wide_a_fan", f"the model asked for {len(calls)} tool calls in one answer; the cap is {MAX_FAN_CALLS}"
    for index, call in enumerate(calls):
        name = call.get("tool") if isinstance(call, Mapping) else None
        if not isinstance(name, str) or not name:
            return "round_expansion_refused", f"call {index + 1} names no tool"
        if get_tool(name) is None:
            return "round_expansion_refused", f"call {index + 1} names {name!r}, which is not installed"
        if allowed is not None and name not in allowed:
            return "round_expansion_refused", f"call {index + 1} names {name!r}, which the round does not list in its tools"
        args = call.get("args", {})
        if not isinstance(args, Mapping):
            return "round_expansion_refused", f"call {index + 1}'s args are not an object"
        try:
            check_storable(args)
        except InvalidRequest as error:
            return "round_expansion_refused", f"call {index + 1}'s args cannot be stored: {error.detail}"
    return None


def round_ask(task_id: int, claim: str, question: str, *, extra: Mapping[str, Any], state: Mapping[str, Any]) -> bool:
    """The model asked a person: a tokenless await in awaiting_input, announced (S9, S20)."""
    with _locked(_run_of(task_id), "model") as txn:
        task = _claimed(txn, task_id, claim)
        if task is None:
            return False
        counter = int(state.get("authored", 0)) + 1
        spec = TaskSpec(
            key=f"{task.key}.{counter}",
            kind="await",
            after=[],
            on_failure="absorb",
            spec={"question": question},
            composed=True,
            lineage=task.lineage,
        )
        fields: dict[str, Any] = {
            "result": _merge_result(txn, task, extra),
            "state": {**state, "authored": counter},
            "claim": None,
        }
        _wait_on(txn, task, [spec], fields)
        return True


def round_oz_fail(
    task_id: int, claim: str, kind: Any, message: Any, *, extra: Mapping[str, Any], state: Mapping[str, Any]
) -> bool:
    """The agent ended the run with oz.fail(kind, message) (F6): canceled with that failure."""
    with _locked(_run_of(task_id), "model") as txn:
        task = _claimed(txn, task_id, claim)
        if task is None:
            return False
        fields: dict[str, Any] = {
            "result": _merge_result(txn, task, extra),
            "state": dict(state),
            "claim": None,
            "finished_at": txn.now,
        }
        refusal = _oz_fail_refusal(kind, message)
        if refusal is not None:
            # The call cannot be read as oz.fail at all: the round fails rather than end the run
            # with a kind the agent never named (F6), and a person sees why.
            fields["state"] = _without_refused_turn(fields["state"])
            _fail_claimed(txn, task, TaskStatus.FAILED, "round_expansion_refused", refusal, fields)
            return True
        declarations = {d["kind"]: d for d in _manifest(txn.run).get("failures", [])}
        if kind in declarations:
            failure = failures.declared_failure(declarations[kind], message)
        else:
            failure = failures.platform_failure("undeclared", message)
        fields["result"] = {**fields["result"], "value": None, "oz_fail": {"kind": kind}}
        txn.move(task, TaskStatus.COMPLETED, **fields)
        fail_run(txn, failure, message, task)
        return True


def _oz_fail_refusal(kind: Any, message: Any) -> str | None:
    if not isinstance(kind, str) or not kind.strip():
        return "oz.fail was called without a kind (a string naming one of the agent's declared kinds)"
    if not isinstance(message, str):
        return "oz.fail was called without a message (the agent's own words, a string)"
    if len(message) > OZ_FAIL_MESSAGE_MAX:
        return f"oz.fail's message is {len(message)} characters; the cap is {OZ_FAIL_MESSAGE_MAX}"
    return None


def round_switch(
    task_id: int, claim: str, model_change: Mapping[str, Any], *, extra: Mapping[str, Any], state: Mapping[str, Any]
) -> bool:
    """A refused or overloaded route gives way to the next captured fallback: back to waiting (S25, S26)."""
    with _locked(_run_of(task_id), "model") as txn:
        task = _claimed(txn, task_id, claim)
        if task is None:
            return False
        result = {**_merge_result(txn, task, extra), "model_change": dict(model_change)}
        txn.event(task.key, "model_change", data=dict(model_change))
        txn.move(task, TaskStatus.WAITING, ready=False, result=result, state=dict(state), claim=None)
        _make_ready(txn, task)
        return True


def round_compact(task_id: int, claim: str, error_detail: str, *, extra: Mapping[str, Any], state: Mapping[str, Any]) -> bool:
    """The provider refused for length: arm a compaction (a summarizer, then the round again),
    or fail with provider_context_overflow when there is no history to summarize (S23)."""
    with _locked(_run_of(task_id), "model") as txn:
        task = _claimed(txn, task_id, claim)
        if task is None:
            return False
        fields: dict[str, Any] = {"result": _merge_result(txn, task, extra), "state": dict(state), "claim": None}
        task.state = dict(state)
        if not arm_compaction_in(txn, task, fields):
            txn.move(task, TaskStatus.FAILED, error=("provider_context_overflow", error_detail), finished_at=txn.now, **fields)
            _after_failure(txn, task)
        return True


def _manifest(run: Run) -> dict[str, Any]:
    if run.agent_version_id is None:
        return {}
    return dict(AgentVersion.objects.filter(pk=run.agent_version_id).values_list("manifest", flat=True).first() or {})
