"""What a model's answer does to the graph (S4-S9, S20, S23-S27): the kernel side of a round.

The worker (`runs.rounds`) calls the provider and reports here: a final answer, a fan of tool
calls (authored as `<round>.<n>` tasks the round then waits on), a question, oz.fail, a switch
to a fallback route, or a length refusal that arms a compaction. Each runs under the run's
row lock like every other transition.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from oz0agents.models import AgentVersion
from runs import failures
from runs.kernel.commit import locked
from runs.kernel.compile import DELEGATE_TOOLS, TaskSpec, check_storable, delegate_call_spec
from runs.kernel.errors import InvalidRequest
from runs.kernel.expansion import add_tasks, arm_compaction_in, expand
from runs.kernel.failure import call_replayable, fail_claimed
from runs.kernel.graph import OPEN_RUN_STATUSES
from runs.kernel.journal import journal_call, journal_write
from runs.kernel.scheduling import after_failure, make_ready
from runs.kernel.settling import fail_run
from runs.kernel.worker import Claimed, held_task, merge_result, task_complete
from runs.models import Run, Task, TaskStatus
from runs.tools import get_tool

MAX_FAN_CALLS = 32
OZ_FAIL_MESSAGE_MAX = 2000


def round_answered(claimed: Claimed, text: str, *, extra: Mapping[str, Any], state: Mapping[str, Any]) -> bool:
    """The model gave its final answer: the round completes with the text as its value."""
    return task_complete(claimed, text, extra=extra, state=state)


def round_expand(
    claimed: Claimed,
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
    with locked(claimed.run_id, "model") as txn:
        task = held_task(txn, claimed)
        if task is None:
            return False
        fields: dict[str, Any] = {"result": merge_result(txn, task, extra), "state": dict(state), "claim": None}
        refusal = _fan_refusal(calls, allowed_tools)
        if refusal is not None:
            key, detail = refusal
            fields["state"] = _without_refused_turn(fields["state"])
            fail_claimed(txn, task, TaskStatus.FAILED, key, detail, {**fields, "finished_at": txn.now})
            return True
        counter = int(state.get("authored", 0))
        specs = []
        for call in calls:
            counter += 1
            name = str(call["tool"])
            kind = "tool"
            spec: dict[str, Any] = {"tool": name, "args": dict(call.get("args") or {})}
            if name in DELEGATE_TOOLS:
                # A delegating tool authors a delegate task: a child run of the agent it names (F14).
                kind, spec = "delegate", delegate_call_spec(name, call.get("args") or {})
            if (tool_timeouts or {}).get(name):
                spec["timeout_s"] = tool_timeouts[name]  # type: ignore[index]
            specs.append(
                TaskSpec(
                    key=f"{task.key}.{counter}",
                    kind=kind,
                    after=[],
                    on_failure=tool_policies.get(name, "absorb"),
                    spec=spec,
                    composed=True,
                    lineage=task.lineage,
                )
            )
        fields["state"] = {**fields["state"], "authored": counter}
        expand(txn, task, specs, fields)
        return True


def _without_refused_turn(state: Mapping[str, Any]) -> dict[str, Any]:
    """A refused answer is not the conversation's last word: a re-run of the step asks the model
    again from where it stood, never from the assistant's own turn (missing_input)."""
    history = list(state.get("history", []))
    if history and history[-1].get("role") == "assistant":
        history.pop()
    return {**state, "history": history}


def _fan_refusal(calls: Sequence[Mapping[str, Any]], allowed: Sequence[str] | None) -> tuple[str, str] | None:
    if len(calls) > MAX_FAN_CALLS:
        return "too_wide_a_fan", f"the model asked for {len(calls)} tool calls in one answer; the cap is {MAX_FAN_CALLS}"
    for index, call in enumerate(calls):
        name = call.get("tool") if isinstance(call, Mapping) else None
        if not isinstance(name, str) or not name:
            return "round_expansion_refused", f"call {index + 1} names no tool"
        if name not in DELEGATE_TOOLS and get_tool(name) is None:
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
        if name in DELEGATE_TOOLS:
            try:
                delegate_call_spec(name, args)
            except InvalidRequest as error:
                return "round_expansion_refused", f"call {index + 1} ({name}): {error.detail}"
    return None


def round_ask(claimed: Claimed, question: str, *, extra: Mapping[str, Any], state: Mapping[str, Any]) -> bool:
    """The model asked a person: a tokenless await in awaiting_input, announced (S9, S20)."""
    with locked(claimed.run_id, "model") as txn:
        task = held_task(txn, claimed)
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
            "result": merge_result(txn, task, extra),
            "state": {**state, "authored": counter},
            "claim": None,
        }
        expand(txn, task, [spec], fields)
        return True


def round_call(
    claimed: Claimed,
    call: Mapping[str, Any],
    *,
    allowed_tools: Sequence[str] | None,
    tool_policies: Mapping[str, str],
    tool_timeouts: Mapping[str, float] | None = None,
    journal_at: int | None = None,
) -> tuple[str | None, str | None]:
    """A harness still running its round asks for one call (F7): a registry tool or a delegating
    built-in (`{"tool", "args"}`; the latter a delegate task, F14), a person's answer (`{"ask": question}`)
    or the approval of a tool of the framework's own (`{"native": name, "args"}`: a tool task marked
    `native` that only crosses the approval stage), authored as the round's next `<round>.<n>` task and
    started as a fan's calls are (the approval stage, the inbox, the park clock), while the round
    stays running and its harness waits for the answer (the round does not wait on it in the graph).

    Returns `(key, None)`, `(None, refusal)` for a call that cannot be authored (the harness reads
    the refusal as the call's failure), or `(None, None)` when the claim is gone or the run stops.
    In a paused run the call is authored and waits, like any ready task, for the resume.
    `journal_at`: the call's place in the round's journal (runs/kernel/journal.py), which the new
    task takes there."""
    with locked(claimed.run_id, "model") as txn:
        task = held_task(txn, claimed)
        if task is None or task.cancel_requested or txn.run.status not in OPEN_RUN_STATUSES:
            return None, None
        counter = int(task.state.get("authored", 0)) + 1
        key = f"{task.key}.{counter}"
        if "ask" in call:
            question = call.get("ask")
            if not isinstance(question, str) or not question.strip():
                return None, "oz.ask needs a question (a non-empty string)"
            spec = TaskSpec(
                key=key,
                kind="await",
                after=[],
                on_failure="absorb",
                spec={"question": question},
                composed=True,
                lineage=task.lineage,
            )
        elif "native" in call:
            native_refusal = _native_refusal(call)
            if native_refusal is not None:
                return None, native_refusal
            # A framework asks before running a tool of its own: the call's digest crosses the
            # approval stage; granted, the task completes without any worker running anything.
            spec = TaskSpec(
                key=key,
                kind="tool",
                after=[],
                on_failure="absorb",
                spec={"tool": call["native"], "args": dict(call.get("args") or {}), "native": True},
                composed=True,
                lineage=task.lineage,
            )
        else:
            refusal = _fan_refusal([call], allowed_tools)
            if refusal is not None:
                return None, refusal[1]
            name = str(call["tool"])
            kind = "tool"
            tool_spec: dict[str, Any] = {"tool": name, "args": dict(call.get("args") or {})}
            if name in DELEGATE_TOOLS:
                # A delegating built-in authors a delegate task: a child run (F14-F17).
                kind, tool_spec = "delegate", delegate_call_spec(name, call.get("args") or {})
            if (tool_timeouts or {}).get(name):
                tool_spec["timeout_s"] = tool_timeouts[name]  # type: ignore[index]
            spec = TaskSpec(
                key=key,
                kind=kind,
                after=[],
                on_failure=tool_policies.get(name, "absorb"),
                spec=tool_spec,
                composed=True,
                lineage=task.lineage,
            )
        task.state = {**task.state, "authored": counter}
        if spec.kind in ("tool", "delegate") and not call_replayable(spec.kind, spec.spec):
            # The session cannot be re-run blind from here on (is_replayable): a person decides.
            task.state["nonreplayable_calls"] = [*task.state.get("nonreplayable_calls", []), key]
        if journal_at is not None:
            tool, digest = journal_call(call)
            journal_write(txn, task, journal_at, {"key": key, "tool": tool, "digest": digest})
        Task.objects.filter(pk=task.pk).update(state=task.state)
        txn.event(task.key, "harness_call", data={"key": key, "tool": spec.spec.get("tool", "oz.ask"), **_native_mark(spec.spec)})
        add_tasks(txn, [spec])
        return key, None


NATIVE_TOOL_MAX = 200


def _native_refusal(call: Mapping[str, Any]) -> str | None:
    name, args = call.get("native"), call.get("args", {})
    if not isinstance(name, str) or not name.strip() or len(name) > NATIVE_TOOL_MAX or name.startswith("oz."):
        return f"an approval needs the name of one of the agent's own tools (at most {NATIVE_TOOL_MAX} characters, not oz.*)"
    if not isinstance(args, Mapping):
        return "the call's args are not an object"
    try:
        check_storable(args)
    except InvalidRequest as error:
        return f"the call's args cannot be stored: {error.detail}"
    return None


def _native_mark(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {"native": True} if spec.get("native") else {}


def round_oz_fail(claimed: Claimed, kind: Any, message: Any, *, extra: Mapping[str, Any], state: Mapping[str, Any]) -> bool:
    """The agent ended the run with oz.fail(kind, message) (F6): canceled with that failure. A round
    whose tools do not list oz.fail cannot end its job so: the round fails round_expansion_refused,
    whichever loop (oz0's own, a harness) reported the call."""
    with locked(claimed.run_id, "model") as txn:
        task = held_task(txn, claimed)
        if task is None:
            return False
        fields: dict[str, Any] = {
            "result": merge_result(txn, task, extra),
            "state": dict(state),
            "claim": None,
            "finished_at": txn.now,
        }
        manifest = _manifest(txn.run)
        refusal = _oz_fail_refusal(kind, message) if _lists_oz_fail(task.spec, manifest) else OZ_FAIL_UNLISTED
        if refusal is not None:
            # The call cannot be read as oz.fail at all: the round fails rather than end the run
            # with a kind the agent never named (F6), and a person sees why.
            fields["state"] = _without_refused_turn(fields["state"])
            fail_claimed(txn, task, TaskStatus.FAILED, "round_expansion_refused", refusal, fields)
            return True
        declarations = {d["kind"]: d for d in manifest.get("failures", [])}
        if kind in declarations:
            failure = failures.declared_failure(declarations[kind], message)
        else:
            failure = failures.platform_failure("undeclared", message)
        fields["result"] = {**fields["result"], "value": None, "oz_fail": {"kind": kind}}
        # The round ended the job in failure: it is failed (never a green `completed` beside a
        # canceled run), keyed oz_fail with the agent's words; its kind and flags are the run's.
        txn.move(task, TaskStatus.FAILED, error=(failures.OZ_FAIL_ERROR_KEY, message), **fields)
        fail_run(txn, failure, message, task)
        return True


OZ_FAIL_UNLISTED = (
    "oz.fail is not in the round's tools (the agent's `tools:`): list it there to end a job with one of its failure kinds"
)


def _lists_oz_fail(spec: Mapping[str, Any], manifest: Mapping[str, Any]) -> bool:
    """Whether the round may end its job with oz.fail (F6): its own `tools`, else its agent's, list it
    (a round's tool list is the one its driver offers the model, runs.worker.round_driver)."""
    listed = spec.get("tools") or manifest.get("tools") or []
    return "oz.fail" in listed


def _oz_fail_refusal(kind: Any, message: Any) -> str | None:
    if not isinstance(kind, str) or not kind.strip():
        return "oz.fail was called without a kind (a string naming one of the agent's declared kinds)"
    if not isinstance(message, str):
        return "oz.fail was called without a message (the agent's own words, a string)"
    if len(message) > OZ_FAIL_MESSAGE_MAX:
        return f"oz.fail's message is {len(message)} characters; the cap is {OZ_FAIL_MESSAGE_MAX}"
    return None


def round_switch(
    claimed: Claimed, model_change: Mapping[str, Any], *, extra: Mapping[str, Any], state: Mapping[str, Any]
) -> bool:
    """A refused or overloaded route gives way to the next captured fallback: back to waiting (S25, S26)."""
    with locked(claimed.run_id, "model") as txn:
        task = held_task(txn, claimed)
        if task is None:
            return False
        result = {**merge_result(txn, task, extra), "model_change": dict(model_change)}
        txn.event(task.key, "model_change", data=dict(model_change))
        txn.move(task, TaskStatus.WAITING, ready=False, result=result, state=dict(state), claim=None)
        make_ready(txn, task)
        return True


def round_compact(claimed: Claimed, error_detail: str, *, extra: Mapping[str, Any], state: Mapping[str, Any]) -> bool:
    """The provider refused for length: arm a compaction (a summarizer, then the round again),
    or fail with provider_context_overflow when there is no history to summarize (S23)."""
    with locked(claimed.run_id, "model") as txn:
        task = held_task(txn, claimed)
        if task is None:
            return False
        fields: dict[str, Any] = {"result": merge_result(txn, task, extra), "state": dict(state), "claim": None}
        task.state = dict(state)
        if not arm_compaction_in(txn, task, fields):
            txn.move(task, TaskStatus.FAILED, error=("provider_context_overflow", error_detail), finished_at=txn.now, **fields)
            after_failure(txn, task)
        return True


def _manifest(run: Run) -> dict[str, Any]:
    if run.agent_version_id is None:
        return {}
    return dict(AgentVersion.objects.filter(pk=run.agent_version_id).values_list("manifest", flat=True).first() or {})
