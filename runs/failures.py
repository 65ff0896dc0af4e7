"""oz0's one failure vocabulary: the platform's kinds, their flags, and error key → kind.

SPEC.md's decision tables live here and nowhere else (F1, F9, F10).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from runs.models import TASK_FAILED


@dataclass(frozen=True)
class Kind:
    kind: str
    retryable: bool
    partial: bool
    person: bool
    when: str


PLATFORM_KINDS: dict[str, Kind] = {
    k.kind: k
    for k in (
        Kind("timeout", True, True, False, "The job, a tool call or a question ran out of time"),
        Kind("budget", False, True, True, "A budget or quota was spent, or a person must raise it"),
        Kind(
            "limit",
            False,
            True,
            False,
            "The job reached one of its own limits: steps, tokens, the tree's depth or children, or a loop",
        ),
        Kind("outcome_not_met", True, False, False, "The answer did not pass its outcome check"),
        Kind("best_of_no_pick", True, False, False, "No candidate of a best-of was good enough to keep"),
        Kind("unknown_outcome", False, True, True, "A write may or may not have happened, and a person said to stop"),
        Kind("denied", False, True, False, "A person or a hook said no to a step"),
        Kind(
            "refused",
            False,
            True,
            True,
            "The platform refused what the job needed: a grant, a policy, a sandbox or the data's rules",
        ),
        Kind("invalid_input", False, False, False, "The input did not match the input contract"),
        Kind("unavailable", True, True, False, "Something the job needs was not there: its agent, a tool, a harness or a node"),
        Kind("model", True, True, False, "The model failed, refused the request or answered in a way the job cannot use"),
        Kind("tool_failed", False, True, False, "A tool call the job could not go on without failed"),
        Kind("cancelled", False, True, False, "Someone or a kill switch stopped the job"),
        Kind("undeclared", False, True, False, "The agent called oz.fail with a kind it does not declare"),
        Kind("error", True, True, False, "Something failed that has no kind of its own"),
    )
}

# SPEC.md "error key → failure kind". Keys not listed map to `error`.
ERROR_KEY_KINDS: dict[str, str] = {
    **dict.fromkeys(
        (
            "provider_http_error",
            "provider_model_unavailable",
            "provider_error",
            "model_refused",
            "provider_overloaded",
            "provider_transient_exhausted",
            "model_route_spent",
            "round_expansion_refused",
        ),
        "model",
    ),
    **dict.fromkeys(
        (
            "provider_context_overflow",
            "context_overflow",
            "too_wide_a_fan",
            "too_many_reads",
            "too_many_steps",
            "content_items_too_many",
            "tree_too_deep",
            "too_many_children",
        ),
        "limit",
    ),
    "attempt_budget_spent": "budget",
    **dict.fromkeys(
        ("missing_input", "payload_too_large", "nul_byte", "exponent_number", "invalid_input", "child_output_invalid"),
        "invalid_input",
    ),
    **dict.fromkeys(
        (
            "input_source_unavailable",
            "model_capability_unavailable",
            "executor_revoked",
            "tool_not_served",
            "unknown_tool",
            "agent_unavailable",
        ),
        "unavailable",
    ),
    "tool_failed": "tool_failed",
    **dict.fromkeys(("tool_timeout", "await_timeout", "approval_expired"), "timeout"),
    **dict.fromkeys(("tool_uncertain", "round_uncertain"), "unknown_outcome"),
    "approval_denied": "denied",
    "run_canceled": "cancelled",
    "join_loser_canceled": "cancelled",
    "await_failed": "error",
    # A skipped flow step is not a failure; were it read as one, the engine chose not to run it.
    "condition_false": "cancelled",
    # A child_failed task carries its child's failure as its own (settling reads it); this is the
    # kind only for a task whose result lost that failure.
    "child_failed": "error",
    # A harness (F7) that is not installed is unavailable; one that crashed or spoke garbage is an error.
    "harness_unavailable": "unavailable",
    **dict.fromkeys(("harness_crashed", "harness_protocol_error"), "error"),
    # A harnessed round past its deadline (its manifest's timeout_s, else OZ0_ROUND_TIMEOUT_SECONDS).
    "round_timeout": "timeout",
}

# The seed's error key table (S22): every key with its meaning.
ERROR_KEYS: dict[str, str] = {
    "provider_http_error": "The provider answered with an error status",
    "provider_model_unavailable": "A provider HTTP 401, 403 or 404",
    "provider_context_overflow": "The provider refused the request for length",
    "context_overflow": "The composed request exceeds the storage bound, the signal a client's compaction consumes",
    "missing_input": "A task with nothing to ask, including a splice whose last word would be the assistant's own",
    "input_source_unavailable": "A source the task reads is gone",
    "round_expansion_refused": "The model's calls could not be authored into a fan, so the round failed rather than vanishing",
    "provider_error": "The provider completed its exchange but reported an abnormal generation finish",
    "model_refused": "The provider declined the step",
    "provider_overloaded": "The provider was overloaded on every attempt",
    "provider_transient_exhausted": "Retryable transport, stream or server failures exhausted the route budget",
    "model_route_spent": "A retry tried to renew a refused or exhausted route",
    "attempt_budget_spent": "The attempt budget ended without an eligible recovery classification",
    "model_capability_unavailable": "The model does not offer something the request asks for",
    "tool_failed": "The parked tool call failed",
    "tool_timeout": "The parked tool call ran out of time",
    "tool_uncertain": "The parked tool call's effect may or may not have happened",
    "await_failed": "The parked await failed",
    "await_timeout": "The parked await ran out of time",
    "executor_revoked": "The executor an unclaimed call was addressed to was removed first",
    "run_canceled": "Every row a stop took before it started",
    "join_loser_canceled": "A join had its answer; this unfinished source was no longer needed",
    "approval_denied": "A person denied the tool call",
    "approval_expired": "Nobody decided the tool call before the park clock ran out",
    "tool_not_served": "No executor serves the tool",
    "harness_unavailable": "The agent's harness (its framework, package or program) is not installed here",
    "harness_crashed": "The agent's harness process or framework ended without finishing its job",
    "round_timeout": "A harnessed round ran past its deadline; its process was killed",
    "round_uncertain": "A harnessed round that had made non-replayable calls lost its worker; a person decides",
    "harness_protocol_error": "The agent's harness said something its protocol does not allow",
    "child_failed": "The delegate task's child run failed; the task carries the child's failure as its own",
    "child_output_invalid": "A quarantined child's answer did not match the task's output_schema",
    "tree_too_deep": "A delegate task would start a child deeper than the tree's depth cap",
    "too_many_children": "A delegate task would start more children than a run may have",
    "agent_unavailable": "A delegate task names no agent of the run's workspace",
    "condition_false": "A flow step's `when:` guard was false: the step was skipped",
}

# A delegate task whose child failed carries the child's failure (kind, flags, declared) as its
# own (F14), kept in its result; the error-key table does not decide its kind.
CHILD_FAILED_ERROR_KEY = "child_failed"
FAILURE_FIELDS = ("kind", "retryable", "partial", "person", "message", "declared")


def child_failure_of(result: dict[str, Any] | None, *, content: bool) -> dict[str, Any] | None:
    """The child's failure a `child_failed` delegate task carries; its words only for a reader the
    content is open to (the child has the parent's workspace, creator and privacy)."""
    failure = (result or {}).get("failure")
    if not isinstance(failure, dict) or "kind" not in failure:
        return None
    shown = {name: failure.get(name) for name in FAILURE_FIELDS}
    if not content:
        shown["message"] = None
    return shown


def words_of_child(agent: Any, child_id: Any) -> str:
    """Whose words a child run's failure message is (F14): the agent that ran it, and its job."""
    return f"the agent {agent} (job {child_id})"


FAILED_TASK_STATUSES = frozenset(TASK_FAILED)

# The platform's own texts, which stay readable for everyone (F11).
PLATFORM_TEXTS = frozenset({"canceled", "terminated", "timed out"})


def kind_for_error_key(error_key: str | None) -> str:
    return ERROR_KEY_KINDS.get(error_key or "", "error")


def platform_failure(kind: str, message: str | None) -> dict[str, Any]:
    flags = PLATFORM_KINDS[kind]
    return {
        "kind": kind,
        "retryable": flags.retryable,
        "partial": flags.partial,
        "person": flags.person,
        "message": message,
        "declared": False,
    }


def declared_failure(declaration: dict[str, Any], message: str | None) -> dict[str, Any]:
    return {
        "kind": declaration["kind"],
        "retryable": bool(declaration.get("retryable", False)),
        "partial": bool(declaration.get("partial", False)),
        "person": bool(declaration.get("person", False)),
        "message": message,
        "declared": True,
    }


# A round that ended the run with oz.fail fails with this key; its failure is the run's (the
# agent's declared kind, or undeclared), not the error-key table's.
OZ_FAIL_ERROR_KEY = "oz_fail"


def task_failure(status: str, error_key: str | None, detail: str | None, *, content: bool) -> dict[str, Any] | None:
    """A failed, timed-out or uncertain task's failure: its error key's kind with the kind's flags,
    and its detail as the message for a reader the content is open to (F10, F11). Every surface
    that shows a task's failure (the API, the console, the inbox, holds) reads it from here."""
    if status not in FAILED_TASK_STATUSES:
        return None
    return platform_failure(kind_for_error_key(error_key), detail if content else None)


def step_failure(
    status: str,
    error_key: str | None,
    detail: str | None,
    *,
    content: bool,
    run_failure: dict[str, Any] | None,
    result: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """task_failure, except that the round that called oz.fail carries the run's failure: the
    kind and flags the agent chose, and its words only for a reader the content is open to; and a
    delegate task whose child failed carries the child's failure the same way."""
    if status in FAILED_TASK_STATUSES and error_key == OZ_FAIL_ERROR_KEY and run_failure:
        return {**run_failure, "message": run_failure.get("message") if content else None}
    if status in FAILED_TASK_STATUSES and error_key == CHILD_FAILED_ERROR_KEY:
        carried = child_failure_of(result, content=content)
        if carried is not None:
            return carried
    return task_failure(status, error_key, detail, content=content)


def task_kind(error_key: str | None, result: Mapping[str, Any] | None) -> str:
    """A failed task's kind: its error key's, except a `child_failed` delegate task's, which is the
    kind of the child's failure it carries (F14)."""
    if error_key == CHILD_FAILED_ERROR_KEY:
        carried = child_failure_of(dict(result) if result else None, content=False)
        if carried is not None:
            return str(carried["kind"])
    return kind_for_error_key(error_key)


def fixed_sentence(kind: str) -> str:
    """The error text a reader the content is closed to sees (F11)."""
    return f"The run failed with kind {kind}."


def redact_failure(failure: dict[str, Any] | None) -> dict[str, Any] | None:
    if failure is None:
        return None
    return {**failure, "message": None}


def redact_error_text(error: str | None, failure: dict[str, Any] | None) -> str | None:
    if error is None or error in PLATFORM_TEXTS:
        return error
    if failure is None:
        return "The run failed."
    return fixed_sentence(failure["kind"])


def redact_task_error(error: dict[str, Any] | None) -> dict[str, Any] | None:
    """A step's error in a trace or a run document keeps its key, never its detail (F12)."""
    if error is None:
        return None
    return {"key": error.get("key"), "detail": None}
