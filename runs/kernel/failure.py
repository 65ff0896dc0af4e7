"""Failure: what happens to a claimed call that failed, and whether a lost call may run again.

`fail_claimed` gives a failed model step its automatic re-runs (S28) before its own policy
(`scheduling.after_failure`) applies; `is_replayable` is the one rule every lost claim or lease
is judged by (S10); `renewed`/`renewed_attempts` are the state a task runs again with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runs.kernel.scheduling import after_failure, make_ready
from runs.kernel.txn import Txn
from runs.models import RunStatus, Task, TaskStatus
from runs.tools import get_tool


def is_replayable(task: Task) -> bool:
    """May a call whose claimant or executor vanished run again blind? A model step may (it has
    no effect outside the run), but for a harnessed round that has made a non-replayable call
    (`nonreplayable_calls`): its session would start over and make it again. A tool a worker runs
    may when the tool says so; a runner's call (or a tool no longer installed) when its tool says
    so or its args declare `replayable: true`."""
    if task.kind == "round":
        return not nonreplayable_calls(task)
    if task.kind != "tool":
        return True
    return call_replayable(task.kind, task.spec)


def call_replayable(kind: str, spec: Mapping[str, Any]) -> bool:
    """Whether a call a round authors may be made again blind: a registry tool that says so. A
    delegation (a child run) and the approval of a framework's own tool (which the framework then
    runs itself) have effects oz0 cannot judge, so they count as non-replayable."""
    if kind != "tool" or spec.get("native"):
        return False
    tool = get_tool(str(spec.get("tool", "")))
    if tool is not None and not tool.runner:
        return tool.replayable
    return bool(tool and tool.replayable) or (spec.get("args") or {}).get("replayable") is True


NOT_MADE = (TaskStatus.CANCELED, TaskStatus.SKIPPED, TaskStatus.FAILED, TaskStatus.TIMED_OUT)


def nonreplayable_calls(task: Task) -> list[dict[str, Any]]:
    """The non-replayable calls a harnessed round has made (`round_call` notes each it authors in
    the round's state), as `{key, tool, status}` in order: every one but those that ended without
    ever starting (denied, expired, canceled or skipped before a worker or child took them)."""
    noted = [str(key) for key in task.state.get("nonreplayable_calls", [])]
    if not noted:
        return []
    rows = Task.objects.filter(run_id=task.run_id, key__in=noted).values_list("key", "status", "attempt", "child_id", "spec")
    made = {}
    for key, status, attempt, child_id, spec in rows:
        never_started = status in NOT_MADE and not attempt and child_id is None
        if not never_started:
            made[key] = {"key": key, "tool": spec.get("tool") or spec.get("agent") or "", "status": status}
    return [made[key] for key in noted if key in made]


# Failures a blind re-run cannot mend: the seeds forbid it (provider_error), the route is
# spent (refusals, exhaustion), or a compaction is the repair (S23-S28).
NOT_AUTO_RETRIED = frozenset(
    {
        "provider_error",
        "model_route_spent",
        "model_refused",
        "provider_overloaded",
        "provider_transient_exhausted",
        "attempt_budget_spent",
        "provider_model_unavailable",
        "provider_context_overflow",
        # A worker's unexpected exception is no model flake: a blind re-run would meet it again.
        "error",
        # Neither is a request the route cannot take or the store cannot hold, nor a source that is gone.
        "model_capability_unavailable",
        "context_overflow",
        "missing_input",
        "input_source_unavailable",
        # A hung harness would hang again; a person decides whether the agent gets another go.
        "round_timeout",
    }
)


def fail_claimed(txn: Txn, task: Task, status: str, error_key: str, detail: str | None, fields: dict[str, Any]) -> None:
    """Fail a claimed task: an automatic re-run when its retry budget allows (S28), else its policy."""
    if auto_retry(txn, task, error_key, detail, fields):
        return
    txn.move(task, status, error=(error_key, detail), **fields)
    after_failure(txn, task)


def auto_retry(txn: Txn, task: Task, error_key: str, detail: str | None, fields: dict[str, Any]) -> bool:
    """S28: a failed model step re-runs automatically `retry.budget` times before its policy applies."""
    if task.kind not in ("round", "summarizer") or txn.run.status == RunStatus.CANCELING or task.cancel_requested:
        return False
    if error_key in NOT_AUTO_RETRIED:
        return False
    if task.kind == "round" and nonreplayable_calls(task):
        # A harnessed session that made a non-replayable call would make it again: a person decides.
        return False
    used = int(task.state.get("auto_retries", 0))
    if used >= txn.run.retry_budget:
        return False
    state = {**task.state, **(fields.get("state") or {}), "auto_retries": used + 1}
    txn.move(task, TaskStatus.FAILED, error=(error_key, detail), **{**fields, "state": state})
    txn.event(task.key, "auto_retry", data={"used": used + 1, "budget": txn.run.retry_budget})
    txn.move(
        task, TaskStatus.WAITING, ready=False, error_key=None, error_detail=None, finished_at=None, state=renewed_attempts(state)
    )
    make_ready(txn, task)
    return True


def renewed_attempts(state: Mapping[str, Any]) -> dict[str, Any]:
    """A round run again (a retry, an automatic re-run, a compaction) starts its step with a fresh
    attempt budget on every route that is not spent; a spent route stays spent (S26, S28)."""
    return {**renewed(state), "step_attempts": {}}


def renewed(state: Mapping[str, Any]) -> dict[str, Any]:
    """A task run again starts with no lost workers counted against it."""
    return {k: v for k, v in state.items() if k != "expired_claims"}


def route_refusal(task: Task) -> str | None:
    """A manual retry cannot renew a refused or exhausted route (S25, S26): it needs an unspent one."""
    spent = set(task.state.get("spent_routes", []))
    if not spent:
        return None
    routes = [task.spec.get("model"), *task.spec.get("fallback_models", [])]
    if any(route not in spent for route in routes):
        return None
    return "every route of this step is spent: " + ", ".join(str(r) for r in routes)
