"""Model calls in a harnessed round's trace (issue 29): each model request a framework reports is a
`provider_call` event of its round, the shape oz0's own loop gives its provider calls
(runs/worker/round_driver.py `_call_entry`: route, attempt, outcome, usage, finish), with what a
framework adds: its model and provider, the request's duration, and how many requests it covers.

A harness reports them in the `usage` of its JSON-lines messages (docs/harness-jsonl.md): any
message may carry `usage` (`{input_tokens, output_tokens, requests?}`) and beside it `model`,
`provider`, `duration_ms`, `finish` and `outcome` (`answer`, or `error` for a request that failed).
The Pydantic AI and Agents SDK bridges send one `usage` line per model request from the
frameworks' own hooks; an ACP agent's prompt response is one. The tokens are billed on the round
and the events written with its report, however it ends (done, oz.fail, a crash, a cancel, the
deadline): the kernel turns each entry of the report's `provider_calls` into an event.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from oz0site import tracing
from runs.worker.harness.base import HarnessSession

# A round's events are bounded: past this many, the rest of its requests are added up into its last.
CALLS_KEPT = 500
NAME_MAX = 200
FINISH_MAX = 40
OUTCOMES = ("answer", "error")


def record_model_use(session: HarnessSession, message: Mapping[str, Any]) -> None:
    """Bill the `usage` a harness's message carries and keep it as the round's next model call."""
    usage = message.get("usage") if isinstance(message.get("usage"), Mapping) else None
    if not usage:
        return
    requests = usage.get("requests", 1)
    calls = requests if _count(requests) else 1
    session.bill(usage, calls=calls)
    if calls == 0:
        return  # tokens with no request to show for them: billed, no event
    entry = call_entry(session, message, usage, calls)
    tracing.model_request_reported(entry, session.trace_context)
    kept = session.provider_calls
    if len(kept) < CALLS_KEPT:
        kept.append(entry)
        return
    last = kept[-1]
    last["calls"] = int(last.get("calls", 1)) + calls
    for key in ("input_tokens", "output_tokens"):
        last["usage"][key] += entry["usage"][key]


def call_entry(session: HarnessSession, message: Mapping[str, Any], usage: Mapping[str, Any], calls: int) -> dict[str, Any]:
    model = _text(message.get("model"), NAME_MAX)
    provider = _text(message.get("provider"), NAME_MAX)
    outcome = message.get("outcome") if message.get("outcome") in OUTCOMES else "answer"
    entry: dict[str, Any] = {
        # The route names the model as oz0's loop names its own (`provider:model`), so the same
        # reads (the scorecard's, the prices') serve both.
        "route": (f"{provider}:{model}" if provider and model and ":" not in model else model) or "unknown",
        "model": model,
        "provider": provider,
        "attempt": len(session.provider_calls) + 1,
        "outcome": outcome,
        "usage": {key: usage[key] if _count(usage.get(key)) else 0 for key in ("input_tokens", "output_tokens")},
        "finish": _text(message.get("finish"), FINISH_MAX),
        "duration_ms": message["duration_ms"] if _count(message.get("duration_ms")) else None,
        "harness": session.harness.get("kind"),
    }
    if calls != 1:
        entry["calls"] = calls
    if outcome == "error":
        entry["exception"] = _text(message.get("exception"), NAME_MAX)
    return entry


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _text(value: Any, most: int) -> str | None:
    return value[:most] if isinstance(value, str) and value else None
