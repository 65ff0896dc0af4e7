"""Worker-side model rounds: compose the request, drive the provider within the route's
attempt budget, classify what it said, and report the outcome through the kernel.

Every provider is classified the same way (S23-S27):
- 401/403/404 → provider_model_unavailable; other 4xx → provider_http_error.
- 429 waits out the Retry-After floor and retries inside the budget; never overload.
- 503, 529 or a streamed overloaded_error on every attempt → provider_overloaded (may
  advance to the next captured fallback); mixed transient failures →
  provider_transient_exhausted; only rate limits → attempt_budget_spent.
- A classifier refusal may switch to the next eligible fallback; content protection
  (`blocked`) never switches.
- An abnormal finish → provider_error, usage billed, nothing expanded or retried.
- A length refusal arms a compaction (S23).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from typing import Any

from django.conf import settings

from oz0site import tracing
from runs import failures, kernel
from runs.kernel import MAX_PAYLOAD_BYTES, Claimed
from runs.models import Run, Task
from runs.tools import get_tool, tool_names
from runs.worker.child_answers import child_message, delegate_schema
from runs.worker.providers import AttemptFailed, ProviderAnswer, ProviderRequest, get_provider
from runs.worker.providers.http import ASK_TOOL
from runs.worker.reporting import settle

log = logging.getLogger(__name__)

OVERLOAD_STATUSES = {503, 529}
UNAVAILABLE_STATUSES = {401, 403, 404}
RATE_LIMIT_FLOOR = 0.05
RATE_LIMIT_CEILING = 60.0
# The pause before another attempt after an overload or a transient failure, per failure seen.
TRANSIENT_BACKOFF = 0.05


class RoundOutcome(Exception):
    """Raised inside the attempt loop when the round's fate is decided."""


def run_round(claimed: Claimed, cancel: threading.Event) -> None:
    task = Task.objects.select_related("run", "run__agent_version").get(pk=claimed.task_id)
    run = task.run
    if claimed.kind == "summarizer":
        _run_summarizer(claimed, task, run, cancel)
        return
    state = dict(claimed.state)
    # This worker reports whatever happens, so the workers lost before it stop counting.
    state.pop("expired_claims", None)
    manifest = run.agent_version.manifest if run.agent_version_id else {}  # type: ignore[union-attr]
    try:
        history = _history(task, run, state, manifest)
    except SourceGone as gone:
        settle(kernel.task_fail, claimed, "input_source_unavailable", str(gone), state=state)
        return
    state["history"] = history
    routes = [task.spec["model"], *task.spec.get("fallback_models", [])]
    route = state.get("route") or routes[0]
    spent: list[str] = list(state.get("spent_routes", []))
    if route in spent:
        route = next((r for r in routes if r not in spent), "")
        if not route:
            settle(kernel.task_fail, claimed, "model_route_spent", "every route of this step is spent", state=state)
            return
        state["route"] = route
    allowed = _allowed_tools(task, manifest)
    usage = dict((task.result or {}).get("usage") or {})
    calls_log: list[dict[str, Any]] = []
    budget = int(settings.OZ0_PROVIDER_ATTEMPTS)
    step_attempts: dict[str, int] = dict(state.get("step_attempts", {}))
    seen: list[str] = []
    cursor_key = route if isinstance(task.spec.get("script"), Mapping) else "*"
    cursors: dict[str, int] = dict(state.get("cursors", {}))
    system = str(manifest.get("instructions", "")) if manifest else ""
    answer: ProviderAnswer | None = None
    failure: AttemptFailed | None = None

    def extra() -> dict[str, Any]:
        return {"usage": usage, "route": route, "provider_calls": calls_log}

    tool_calls = _offers_tool_calls(route)
    offered = [_tool_schema(name) for name in (allowed if allowed is not None else tool_names())] if tool_calls else []
    refusal = _request_refusal(history, system, offered, allowed, tool_calls, route)
    if refusal is not None:
        settle(kernel.task_fail, claimed, *refusal, state=state)
        return

    while step_attempts.get(route, 0) < budget:
        if cancel.is_set():
            settle(kernel.task_stopped, claimed)
            return
        step_attempts[route] = step_attempts.get(route, 0) + 1
        request = ProviderRequest(
            route=route,
            model=route.split(":", 1)[-1],
            system=system,
            messages=history,
            tools=offered,
            call_index=cursors.get(cursor_key, 0),
            script=task.spec.get("script"),
        )
        cursors[cursor_key] = cursors.get(cursor_key, 0) + 1
        state.update(step_attempts=step_attempts, cursors=cursors)
        try:
            with tracing.model_request(route, step_attempts[route]) as traced:
                answer = get_provider(route).complete(request)
                traced.answered(answer.usage, answer.finish)
        except AttemptFailed as attempt:
            _bill(usage, attempt.usage)
            calls_log.append(_call_entry(route, step_attempts[route], attempt=attempt, request=request, state=state))
            failure = attempt
            decided = _classify_attempt(attempt, seen, cancel)
            if decided == "retry":
                continue
            break
        except Exception as error:  # a provider bug is a transient failure of this attempt
            log.exception("provider %s failed", route)
            failure = AttemptFailed("transport", f"{type(error).__name__}: {error}")
            calls_log.append(_call_entry(route, step_attempts[route], attempt=failure, request=request, state=state))
            seen.append("transient")
            continue
        else:
            _bill(usage, answer.usage)
            calls_log.append(_call_entry(route, step_attempts[route], answer=answer, request=request, state=state))
            failure = None
            break

    state["step_attempts"] = step_attempts
    if answer is not None and failure is None:
        _report_answer(claimed, task, state, answer, history, allowed, manifest, extra())
        return
    if failure is None:
        # The route's attempts were spent before this step began: the kernel renews them on a
        # retry, so only a spent route gets here, and a spent route is never renewed (S26).
        state["spent_routes"] = sorted({*spent, route})
        settle(
            kernel.task_fail,
            claimed,
            "model_route_spent",
            f"the attempt budget of {route} is spent ({budget} attempts)",
            extra=extra(),
            state=state,
        )
        return
    _report_failure(claimed, task, state, failure, seen, routes, route, extra())


class SourceGone(Exception):
    """A task the round reads (a call it authored, an answer it asked for) is no longer there."""


def _offers_tool_calls(route: str) -> bool:
    try:
        return bool(getattr(get_provider(route), "tool_calls", True))
    except Exception:  # an unknown or broken provider: the attempts classify it
        return True


def _request_refusal(
    history: list[dict[str, Any]],
    system: str,
    tools: list[dict[str, Any]],
    allowed: list[str] | None,
    tool_calls: bool,
    route: str,
) -> tuple[str, str] | None:
    """What makes the step's request unaskable before any provider sees it (S22): nothing to ask,
    declared tools on a lane without tool calls, or a request over the storage bound."""
    last = history[-1] if history else {}
    if len(history) == 1 and not str(last.get("content") or "").strip() and not system.strip():
        return "missing_input", "the round has nothing to ask: no prompt, no input and no instructions"
    if last.get("role") == "assistant":
        return "missing_input", "the conversation's last word would be the assistant's own"
    if allowed and not tool_calls:
        return (
            "model_capability_unavailable",
            f"the round declares tools ({', '.join(allowed)}) but {route} offers no tool calls",
        )
    size = len(json.dumps({"system": system, "messages": history, "tools": tools}, sort_keys=True).encode())
    if size > MAX_PAYLOAD_BYTES:
        return (
            "context_overflow",
            f"the composed request is {size} bytes; the storage bound is {MAX_PAYLOAD_BYTES} (compact the round)",
        )
    return None


def _classify_attempt(attempt: AttemptFailed, seen: list[str], cancel: threading.Event) -> str:
    """`retry` to spend another attempt of the budget, `stop` when the attempt decides the round."""
    if attempt.kind == "http" and attempt.http_status == 429:
        seen.append("rate_limit")
        wait = min(max(attempt.retry_after or 0.0, RATE_LIMIT_FLOOR), RATE_LIMIT_CEILING)
        cancel.wait(wait)
        return "retry"
    if (attempt.kind == "http" and attempt.http_status in OVERLOAD_STATUSES) or (
        attempt.kind == "stream_error" and attempt.word == "overloaded_error"
    ):
        seen.append("overload")
        cancel.wait(min(TRANSIENT_BACKOFF * len(seen), 1.0))
        return "retry"
    if (attempt.kind == "http" and (attempt.http_status or 0) >= 500) or attempt.kind in ("transport", "stream_error"):
        seen.append("transient")
        cancel.wait(min(TRANSIENT_BACKOFF * len(seen), 1.0))
        return "retry"
    return "stop"


def _report_failure(
    claimed: Claimed,
    task: Task,
    state: dict[str, Any],
    failure: AttemptFailed,
    seen: list[str],
    routes: list[str],
    route: str,
    extra: dict[str, Any],
) -> None:
    spent = list(state.get("spent_routes", []))
    switch_reason: str | None = None
    key: str
    detail: str
    if failure.kind == "context_overflow":
        settle(kernel.round_compact, claimed, failure.detail, extra=extra, state=state)
        return
    if failure.kind == "finish_error":
        key, detail = "provider_error", f"the provider finished with {failure.word!r}"
    elif failure.kind == "malformed":
        key, detail = "round_expansion_refused", f"the provider's answer could not be read: {failure.detail}"
    elif failure.kind == "refusal":
        key = "model_refused"
        spent.append(route)
        if failure.refusal == "classifier":
            detail = f"the provider's classifier refused the step ({failure.category or 'no category'})"
            switch_reason = "model_refused"
        else:
            detail = "content protection blocked the step"
    elif failure.kind == "http" and failure.http_status in UNAVAILABLE_STATUSES:
        key, detail = "provider_model_unavailable", f"the provider answered HTTP {failure.http_status} for {route}"
    elif failure.kind == "http" and failure.http_status is not None and failure.http_status < 500 and failure.http_status != 429:
        key, detail = "provider_http_error", f"the provider answered HTTP {failure.http_status}"
    else:
        spent.append(route)
        if seen and all(s == "overload" for s in seen):
            key, detail = "provider_overloaded", f"the provider was overloaded on all {len(seen)} attempts"
            switch_reason = "provider_overloaded"
        elif any(s in ("overload", "transient") for s in seen):
            key, detail = "provider_transient_exhausted", f"transient failures exhausted the route's budget ({', '.join(seen)})"
        else:
            key, detail = "attempt_budget_spent", f"the attempt budget ended on rate limits ({len(seen)} attempts)"
    state["spent_routes"] = sorted(set(spent))
    if switch_reason is not None:
        nxt = next((r for r in routes if r not in state["spent_routes"]), None)
        if nxt is not None:
            change = {"from": route, "to": nxt, "reason": switch_reason}
            if failure.category:
                change["category"] = failure.category
            state["route"] = nxt
            settle(kernel.round_switch, claimed, change, extra=extra, state=state)
            return
    if failure.category and key == "model_refused":
        extra = {**extra, "refusal": {"type": failure.refusal, "category": failure.category}}
    settle(kernel.task_fail, claimed, key, detail, extra=extra, state=state)


def _report_answer(
    claimed: Claimed,
    task: Task,
    state: dict[str, Any],
    answer: ProviderAnswer,
    history: list[dict[str, Any]],
    allowed: list[str] | None,
    manifest: Mapping[str, Any],
    extra: dict[str, Any],
) -> None:
    oz_fail = answer.oz_fail
    calls = list(answer.tool_calls)
    for call in calls:
        if isinstance(call, Mapping) and call.get("tool") == "oz.fail":
            args = call.get("args")
            args = args if isinstance(args, Mapping) else {}
            oz_fail = {"kind": args.get("kind"), "message": args.get("message")}
    if oz_fail is not None:
        history.append({"role": "assistant", "oz_fail": oz_fail})
        settle(kernel.round_oz_fail, claimed, oz_fail.get("kind"), oz_fail.get("message"), extra=extra, state=state)
        return
    if answer.ask is not None:
        key = f"{task.key}.{int(state.get('authored', 0)) + 1}"
        history.append({"role": "assistant", "ask": answer.ask, "key": key})
        settle(kernel.round_ask, claimed, answer.ask, extra=extra, state=state)
        return
    if calls:
        base = int(state.get("authored", 0))
        history.append(
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": f"{task.key}.{base + i + 1}", "tool": c.get("tool"), "args": c.get("args") or {}}
                    for i, c in enumerate(c if isinstance(c, Mapping) else {} for c in calls)
                ],
            }
        )
        # The next model step of this lineage starts with a fresh attempt budget.
        state["step_attempts"] = {}
        policies = dict(manifest.get("tool_on_failure", {})) if manifest else {}
        timeouts = dict(manifest.get("tool_timeouts", {})) if manifest else {}
        settle(
            kernel.round_expand,
            claimed,
            calls,
            extra=extra,
            state=state,
            allowed_tools=allowed,
            tool_policies=policies,
            tool_timeouts=timeouts,
        )
        return
    history.append({"role": "assistant", "content": answer.text or ""})
    settle(kernel.round_answered, claimed, answer.text or "", extra=extra, state=state)


def _history(task: Task, run: Run, state: dict[str, Any], manifest: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The lineage's conversation so far, with the results of the tasks it authored folded in."""
    history: list[dict[str, Any]] = list(state.get("history", []))
    if not history:
        prompt = str(task.spec.get("prompt", ""))
        if manifest and prompt == manifest.get("instructions"):
            prompt = ""  # an agent's instructions already travel as the system prompt
        if run.input is not None:
            prompt = (
                f"{prompt}\n\nInput:\n{json.dumps(run.input, sort_keys=True)}"
                if prompt
                else json.dumps(run.input, sort_keys=True)
            )
        # The APIs refuse an empty first turn: an agent's instructions with no input start with a nudge;
        # a round with no words at all has nothing to ask (missing_input).
        history.append({"role": "user", "content": prompt or ("Begin." if manifest and manifest.get("instructions") else "")})
    folded = set(state.get("folded", []))
    authored = [k for k in task.after if k.startswith(f"{task.key}.") and k not in folded]
    if authored:
        rows = {t.key: t for t in Task.objects.filter(run=run, key__in=authored)}
        for key in authored:
            source = rows.get(key)
            if source is None:
                raise SourceGone(f"{key}, which the round reads, is gone")
            if source.kind == "summarizer":
                summary = (source.result or {}).get("value")
                history = [history[0], {"role": "user", "content": f"Summary of the conversation so far:\n{summary}"}]
                state["compacted_at"] = len(history)
            elif source.kind == "await":
                history.append({"role": "user", "content": _as_text((source.result or {}).get("value")), "answers": key})
            elif source.kind == "delegate":
                history.append(child_message(source))
            else:
                history.append(tool_message(source))
            folded.add(key)
        state["folded"] = sorted(folded)
    return history


def tool_message(source: Task) -> dict[str, Any]:
    """A tool's answer for the model; a failed call is labelled as failed, with the tool's words.
    A call a person edited before approving says so, by whom, and with which arguments it ran."""
    edited = _edit_label(source)
    if source.status == "completed":
        return {
            "role": "tool",
            "id": source.key,
            "tool": source.spec.get("tool"),
            "ok": True,
            # In the content too: a provider passes the model a tool message's content alone.
            "content": (f"[{edited['edited']['note']}: {_as_text(source.spec.get('args'))}]\n" if edited else "")
            + _as_text((source.result or {}).get("value")),
            **edited,
        }
    failure = failures.task_failure(source.status, source.error_key, source.error_detail, content=True) or (
        failures.platform_failure("error", source.error_detail)
    )
    label = {
        "failed": True,
        "status": source.status,
        **failure,
        "error": source.error_key,
        "words_of": _words_of(source),
        **edited,
    }
    return {
        "role": "tool",
        "id": source.key,
        "tool": source.spec.get("tool"),
        "ok": False,
        "content": json.dumps(label, sort_keys=True),
        **edited,
    }


def _edit_label(source: Task) -> dict[str, Any]:
    editor = (source.state or {}).get("edited_by")
    if not editor:
        return {}
    return {"edited": {"by": editor, "args": source.spec.get("args"), "note": f"{editor} edited your arguments before approving"}}


def _words_of(source: Task) -> str:
    """Whose words a failed call's message is (F14): a denial is the approver's, not the tool's."""
    if source.error_key == "approval_denied":
        approver = source.state.get("denied_by")
        return f"the approver {approver}" if approver else "the approval rules"
    if source.error_key in ("tool_timeout", "tool_not_served", "executor_revoked", "tool_uncertain", "run_canceled"):
        return "oz0"
    return f"the tool {source.spec.get('tool')}"


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _allowed_tools(task: Task, manifest: Mapping[str, Any]) -> list[str] | None:
    listed = task.spec.get("tools") or (manifest.get("tools") if manifest else None)
    if not listed:
        return None
    return [str(t) for t in listed]


def _tool_schema(name: str) -> dict[str, Any]:
    if name == "oz.ask":
        return dict(ASK_TOOL)
    if name == "oz.fail":
        return {
            "name": "oz.fail",
            "description": "End the job with one of your declared failure kinds and a message in your own words",
            "parameters": {
                "type": "object",
                "properties": {"kind": {"type": "string"}, "message": {"type": "string", "maxLength": 2000}},
                "required": ["kind", "message"],
            },
        }
    if name in kernel.DELEGATE_TOOLS:
        return delegate_schema(name)
    tool = get_tool(name)
    return {
        "name": name,
        "description": tool.description if tool else "",
        "parameters": {"type": "object", "additionalProperties": True},
    }


def _bill(usage: dict[str, Any], more: Mapping[str, int]) -> None:
    for key in ("input_tokens", "output_tokens"):
        usage[key] = int(usage.get(key, 0)) + int(more.get(key, 0) or 0)
    usage["calls"] = int(usage.get("calls", 0)) + 1


def _call_entry(
    route: str,
    attempt_number: int,
    *,
    request: ProviderRequest,
    answer: ProviderAnswer | None = None,
    attempt: AttemptFailed | None = None,
    state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One provider call for the trace: the request (system, tool names, and the messages the
    lineage's trace does not hold yet — earlier calls already recorded the rest, so a long
    conversation does not grow its trace quadratically), what came back, and the tokens billed."""
    traced = int((state or {}).get("traced_messages", 0))
    if traced > len(request.messages):
        traced = 0  # a compaction replaced the history: record it whole again
    entry: dict[str, Any] = {
        "route": route,
        "attempt": attempt_number,
        "messages": len(request.messages),
        "request": {
            "system": request.system,
            "messages_from": traced,
            "messages": list(request.messages[traced:]),
            "tools": [t.get("name") for t in request.tools],
        },
    }
    if state is not None:
        state["traced_messages"] = len(request.messages)
    if answer is not None:
        entry.update(outcome="answer", usage=answer.usage, finish=answer.finish)
        entry["answer"] = {
            "text": answer.text,
            "tool_calls": list(answer.tool_calls),
            "ask": answer.ask,
            "oz_fail": answer.oz_fail,
        }
    if attempt is not None:
        entry.update(
            outcome=attempt.kind, status=attempt.http_status, word=attempt.word, usage=attempt.usage, detail=attempt.detail[:500]
        )
        if attempt.refusal:
            entry["refusal"] = {"type": attempt.refusal, "category": attempt.category}
    return entry


def _run_summarizer(claimed: Claimed, task: Task, run: Run, cancel: threading.Event) -> None:
    """Summarize the round's history so the round can run again under the length bound."""
    of = Task.objects.filter(run=run, key=task.spec.get("of")).first()
    if of is None:
        settle(kernel.task_fail, claimed, "input_source_unavailable", f"{task.spec.get('of')}, the round to summarize, is gone")
        return
    history = list(of.state.get("history", []))
    route = str(task.spec.get("model") or "script")
    if route.startswith("script"):
        summary = f"{len(history)} earlier messages, compacted."
        settle(kernel.task_complete, claimed, summary)
        return
    # The history travels as one transcript (the newest part when it is long): tool calls and
    # results stay readable without the APIs' pairing rules, and the request stays under the bound.
    transcript = _transcript(history)
    request = ProviderRequest(
        route=route,
        model=route.split(":", 1)[-1],
        system="Summarize the conversation so far in a few sentences, keeping every fact the next step needs.",
        messages=[{"role": "user", "content": transcript}],
        tools=[],
    )
    try:
        with tracing.model_request(route, 1) as traced:
            answer = get_provider(route).complete(request)
            traced.answered(answer.usage, answer.finish)
    except AttemptFailed as failure:
        calls = [_call_entry(route, 1, attempt=failure, request=request)]
        settle(
            kernel.task_fail,
            claimed,
            "provider_http_error" if failure.kind == "http" else "provider_error",
            failure.detail,
            extra={"usage": dict(failure.usage), "provider_calls": calls},
        )
        return
    except Exception as error:  # a provider bug fails the summarizer, never the worker
        log.exception("summarizer provider %s failed", route)
        settle(kernel.task_fail, claimed, "provider_error", f"{type(error).__name__}: {error}")
        return
    calls = [_call_entry(route, 1, answer=answer, request=request)]
    settle(kernel.task_complete, claimed, answer.text or "", extra={"usage": answer.usage, "provider_calls": calls})


TRANSCRIPT_MAX = 200_000


def _transcript(history: list[dict[str, Any]]) -> str:
    lines = []
    for message in history:
        role = message.get("role")
        if message.get("tool_calls"):
            for call in message["tool_calls"]:
                lines.append(f"assistant called {call.get('tool')} {json.dumps(call.get('args') or {}, sort_keys=True)}")
        elif message.get("ask") is not None:
            lines.append(f"assistant asked: {message['ask']}")
        elif role == "tool":
            lines.append(f"tool {message.get('tool')} ({'ok' if message.get('ok') else 'failed'}): {message.get('content')}")
        else:
            lines.append(f"{role}: {message.get('content', '')}")
    text = "\n".join(lines)
    return text if len(text) <= TRANSCRIPT_MAX else "[earlier messages omitted]\n" + text[-TRANSCRIPT_MAX:]
