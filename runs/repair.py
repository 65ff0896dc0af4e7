"""Many held runs repaired (retry or abandon): one transaction and one kernel verb per run, so
one run's refusal never undoes another's repair; a service the console's bulk repair and
POST /api/v1/workspaces/{ws}/holds/retry|abandon both call. The runs are chosen by
runs/holds.py's `HoldFilter`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import transaction

from runs import kernel
from runs.holds import BULK_CAP, HoldFilter, held_runs_query, repair_targets, select_held_runs, whose
from runs.models import Run, RunStatus, TraceEvent
from tenancy.models import Workspace

VERBS: dict[str, Callable[..., Any]] = {"retry": kernel.retry, "abandon": kernel.abandon, "abandon_and_cancel": kernel.abandon}

DONE = {"retry": "retried", "abandon": "abandoned", "abandon_and_cancel": "abandoned_and_canceled"}
CHUNK = 10


def repair_held_run(workspace: Workspace, user: Any, verb: str, hold_filter: HoldFilter, run_id: Any) -> dict[str, Any]:
    """One run repaired in one transaction, or skipped with the reason: the per-run result."""
    act = VERBS[verb]
    keys: list[str] = []
    try:
        with transaction.atomic():
            # The row lock first: a racing bulk or click on this run waits here, then sees our result.
            run = Run.objects.select_for_update().defer("input", "output").filter(pk=run_id, workspace=workspace).first()
            if run is None:
                return skipped(run_id, keys, "not_held", "no such held run in this workspace")
            if run.status != RunStatus.NEEDS_ATTENTION:
                return skipped(run_id, keys, "not_held", f"the run is {run.status.replace('_', ' ')}{last_repair(run)}")
            if not held_runs_query(workspace, hold_filter).filter(pk=run.pk).exists():
                return skipped(run_id, keys, "no_longer_matches", "the run no longer matches the filter")
            keys = [task.key for task in repair_targets([run], hold_filter)[run.pk]]
            if not keys:
                return skipped(run_id, keys, "no_candidates", "no failure of this run is a retry or abandon candidate")
            for number, key in enumerate(keys, 1):
                if verb == "abandon_and_cancel":
                    # Every failure abandoned, then the run canceled with the last: one transaction.
                    act(run_id=run.pk, key=key, user=user, cancel_run=number == len(keys))
                else:
                    act(run_id=run.pk, key=key, user=user)
    except kernel.KernelError as error:
        return skipped(run_id, keys, error.key, error.detail)
    return {"run": str(run_id), "task_keys": keys, "outcome": DONE[verb]}


def skipped(run_id: Any, keys: list[str], reason: str, detail: str) -> dict[str, Any]:
    return {"run": str(run_id), "task_keys": keys, "outcome": "skipped", "reason": reason, "detail": detail}


def last_repair(run: Run) -> str:
    """Who last repaired the run, for the one who lost the race (", retried by alice")."""
    event = TraceEvent.objects.filter(run=run, event="verb").order_by("-seq").only("actor", "data").first()
    if event is None:
        return ""
    verb = (event.data or {}).get("verb") or "repaired"
    return f"; {DONE.get(verb, verb + 'd')} by {event.actor or 'someone'}"


def repair_runs(workspace: Workspace, user: Any, verb: str, hold_filter: HoldFilter, run_ids: list[Any]) -> list[dict[str, Any]]:
    return [repair_held_run(workspace, user, verb, hold_filter, run_id) for run_id in run_ids]


def bulk_repair(workspace: Workspace, user: Any, verb: str, hold_filter: HoldFilter, *, dry_run: bool) -> dict[str, Any]:
    """What POST /api/v1/workspaces/{ws}/holds/<verb> answers: a preview, or the per-run results."""
    kernel.require_write(user, workspace.pk)
    chosen, more = select_held_runs(workspace, hold_filter, user=user)
    answer: dict[str, Any] = {"verb": verb, "dry_run": dry_run, "cap": BULK_CAP, "more": more, "count": len(chosen)}
    if dry_run:
        # Whose runs these are, so a filter never reaches other people's runs unsaid.
        return answer | {"runs": chosen} | whose(chosen)
    results = repair_runs(workspace, user, verb, hold_filter, [item["run"] for item in chosen])
    done = sum(1 for result in results if result["outcome"] != "skipped")
    return answer | {"count": done, "skipped": len(results) - done, "results": results}


# ---- the Holds page's bulk panel ----
