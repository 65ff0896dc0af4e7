"""Held runs as a repairer needs them: a service the holds page, the run page's repair card,
bulk repair and POST /api/v1/workspaces/{ws}/holds/retry|abandon all call.

The selector batches its reads (three queries whatever the page's size). `HoldFilter` and
`select_held_runs` choose the runs a bulk repair acts on (runs/repair.py), so the page, its
preview and the API pick the same runs.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from oz0agents.models import AgentVersion
from runs import failures
from runs.kernel import InvalidRequest, nonreplayable_calls, repair_candidates_of, whole_number
from runs.models import TASK_FAILED, Run, RunStatus, Task
from runs.permissions import behind_a_wall, can_read_content
from runs.selectors import task_error
from tenancy.models import Workspace


def held_runs(user: Any, workspace: Workspace, *, run_ids: list[Any] | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """Held runs, oldest hold first, each with its failed tasks and repair candidates.

    Three queries whatever the page's size: the runs, their failed tasks, their traces.
    """
    runs_qs = Run.objects.filter(workspace=workspace, status=RunStatus.NEEDS_ATTENTION).select_related("workspace")
    if run_ids is not None:
        runs_qs = runs_qs.filter(pk__in=run_ids)
    runs = list(runs_qs.order_by("held_since", "id")[:limit])
    return hold_documents(user, runs)


def run_hold_document(user: Any, run: Run) -> dict[str, Any]:
    """One run's repair card (the run page's). Its candidates come from the trace (S15, S16), but
    a candidate is a failed task with no resolution whose policy is not absorb (or an uncertain
    call), and the rows are the trace replayed: with no such row there is none, and a long trace
    is not read to learn it."""
    failed = list(Task.objects.filter(run=run, status__in=TASK_FAILED).order_by("position"))
    possible = any(t.failure_resolution is None and (t.on_failure != "absorb" or t.status == "uncertain") for t in failed)
    candidates = repair_candidates_of([run.pk])[run.pk] if possible else []
    return hold_document(user, run, failed, candidates, timezone.now())


def hold_documents(user: Any, runs: list[Run]) -> list[dict[str, Any]]:
    if not runs:
        return []
    ids = [r.pk for r in runs]
    failed: dict[Any, list[Task]] = defaultdict(list)
    for task in Task.objects.filter(run_id__in=ids, status__in=TASK_FAILED).order_by("position"):
        failed[task.run_id].append(task)
    candidates = repair_candidates_of(ids)
    stranding = deliverable_needs(ids, [key for keys in candidates.values() for key in keys])
    now = timezone.now()
    return [hold_document(user, run, failed[run.pk], candidates[run.pk], now, stranding[run.pk]) for run in runs]


# The deliverable's sources whose failure skips it: a join that completes without every source
# ("any", "quorum") or settles on failures ("settled") stops the walk, as it does not skip.
DELIVERABLE_NEEDS = """
WITH RECURSIVE needed(run_id, key) AS (
    SELECT id, deliverable::text FROM runs_run WHERE id = ANY(%s) AND deliverable <> ''
    UNION
    SELECT task.run_id, unnest(task.after)::text FROM runs_task task
    JOIN needed ON task.run_id = needed.run_id AND task.key = needed.key
    WHERE NOT (task.kind = 'join' AND coalesce(task.spec->>'mode', 'all') <> 'all')
)
SELECT run_id, key FROM needed WHERE key = ANY(%s)
"""


def deliverable_needs(run_ids: list[Any], keys: list[str]) -> dict[Any, set[str]]:
    """Of these keys, per run: the deliverable itself and the tasks it cannot do without, whose
    abandon leaves the run held as `deliverable_unresolved` (said before the click)."""
    needs: dict[Any, set[str]] = defaultdict(set)
    if not run_ids or not keys:
        return needs
    with connection.cursor() as cursor:
        cursor.execute(DELIVERABLE_NEEDS, [list(run_ids), list(dict.fromkeys(keys))])
        for run_id, key in cursor.fetchall():
            needs[run_id].add(key)
    return needs


def hold_document(
    user: Any, run: Run, failed_tasks: list[Task], candidates: list[str], now: datetime, stranding: AbstractSet[str] = frozenset()
) -> dict[str, Any]:
    content = can_read_content(user, run)
    attention = run.attention or {}
    since = run.held_since or run.updated_at
    return {
        "run": str(run.id),
        "agent": run.agent_name or None,
        "status": run.status,
        "reason": attention.get("reason"),
        "blocked_task_keys": attention.get("blocked_task_keys", []),
        "kinds": attention.get("kinds", []),
        "since": since,
        "waited_seconds": max(0, int((now - since).total_seconds())),
        "content_visible": content,
        # Someone else's private run, told apart from a role that reads no words (issue 30.8).
        "private_of": (run.created_by.get_username() if run.created_by else "its creator")
        if run.private and not content
        else None,
        # Behind a wall around the run's agent (F11): that agent's name.
        "walled": run.agent_name if not content and behind_a_wall(user, run) else None,
        "candidates": candidates,
        "deliverable": run.deliverable or None,
        "failed": [failed_task_document(t, content, t.key in candidates, t.key in stranding) for t in failed_tasks],
    }


def failed_task_document(task: Task, content: bool, candidate: bool, strands_deliverable: bool = False) -> dict[str, Any]:
    # A delegate task whose child failed shows the child's kind and flags (F14).
    failure = (
        failures.step_failure(
            task.status, task.error_key, task.error_detail, content=content, run_failure=None, result=task.result
        )
        or {}
    )
    return {
        "key": task.key,
        "task_kind": task.kind,
        "status": task.status,
        "on_failure": task.on_failure,
        "attempt": task.attempt,
        "error": task_error(task, content),
        "failure": failure,
        "failure_resolution": task.failure_resolution,
        "kind": failure.get("kind"),
        "retryable": failure.get("retryable"),
        "partial": failure.get("partial"),
        "person": failure.get("person"),
        "declared": failure.get("declared"),
        "candidate": candidate,
        "compactable": candidate and task.kind == "round",
        # A harnessed round's non-replayable calls, which its retry must confirm (its agent may make them again).
        "nonreplayable_calls": nonreplayable_calls(task) if candidate and task.kind == "round" else [],
        # Abandoning it leaves the run held (its deliverable unresolved): the page offers abandon and cancel.
        "strands_deliverable": candidate and strands_deliverable,
    }


# ---- many holds at once: the filter bulk repair selects by ----

# The most runs one bulk request repairs (API and console alike); a wider filter answers `more`.
BULK_CAP = 200
FILTER_FIELDS = ("agent", "version", "kind", "error_key", "min_age_seconds", "mine", "runs", "all")
TEXT_MAX = 100
AGE_MAX_SECONDS = 10 * 365 * 86400


@dataclass(frozen=True)
class HoldFilter:
    """Which held runs a bulk repair acts on, and which of each run's repair candidates.

    Run-level criteria (agent, version, age, explicit ids) choose runs; task-level criteria (kind,
    error key) choose among a run's candidates, so "retry kind timeout" never retries another kind.
    """

    agent: str | None = None
    version: int | None = None
    kind: str | None = None
    error_key: str | None = None
    min_age_seconds: int | None = None
    # "Created by me": the id of the person asking, taken from the request, never from the form.
    created_by: int | None = None
    runs: tuple[uuid.UUID, ...] | None = None
    all: bool = False

    def task_q(self) -> Q:
        """Failed, unresolved tasks matching the kind and error key (all of them when neither is set)."""
        q = Q(status__in=TASK_FAILED, failure_resolution__isnull=True)
        if self.error_key is not None:
            q &= Q(error_key=self.error_key)
        if self.kind is not None:
            child = failures.CHILD_FAILED_ERROR_KEY
            keys = [key for key, kind in failures.ERROR_KEY_KINDS.items() if kind == self.kind and key != child]
            by_key = Q(error_key__in=keys)
            if self.kind == "error":
                # "error" is also every key without a kind of its own (kind_for_error_key's default).
                by_key |= ~Q(error_key__in=list(failures.ERROR_KEY_KINDS)) | Q(error_key__isnull=True)
            # A child_failed delegate task has its child's kind (F14), which settling keeps in its result.
            q &= by_key | Q(error_key=child, result__failure__kind=self.kind)
        return q

    def describe(self) -> str:
        """The filter in words, for the confirmation ("of agent triage, kind timeout")."""
        parts = []
        if self.agent is not None:
            parts.append(f"of agent {self.agent}")
        if self.version is not None:
            parts.append(f"version {self.version}")
        if self.kind is not None:
            parts.append(f"kind {self.kind}")
        if self.error_key is not None:
            parts.append(f"error key {self.error_key}")
        if self.min_age_seconds is not None:
            parts.append(f"held at least {self.min_age_seconds}s")
        if self.created_by is not None:
            parts.append("created by you")
        if self.runs is not None:
            parts.append(f"among {len(self.runs)} chosen")
        return ", ".join(parts)

    def as_fields(self) -> list[tuple[str, str]]:
        """The filter as form fields (name, value), for the console's hidden inputs."""
        fields = [(name, str(getattr(self, name))) for name in ("agent", "version", "kind", "error_key", "min_age_seconds")]
        fields = [(name, value) for name, value in fields if value != "None"]
        fields += [("mine", "1")] if self.created_by is not None else []
        fields += [("runs", str(run)) for run in self.runs or ()]
        return fields + ([("all", "1")] if self.all else [])


def declared_kinds(workspace: Workspace) -> set[str]:
    """The failure kinds the workspace's agents declare, in any version: a delegate task whose
    child failed holds its parent on one of them (F14)."""
    declared: set[str] = set()
    for listed in AgentVersion.objects.filter(agent__workspace=workspace).values_list("manifest__failures", flat=True):
        if isinstance(listed, list):
            declared.update(str(item["kind"]) for item in listed if isinstance(item, dict) and isinstance(item.get("kind"), str))
    return declared


def parse_hold_filter(body: Mapping[str, Any], workspace: Workspace, user: Any = None) -> HoldFilter:
    """A bulk repair's filter from a JSON object; anything malformed is a typed 400 (InvalidRequest).
    `mine: true` keeps the runs `user` created (the person asking: never an id the body names)."""
    unknown = set(body) - set(FILTER_FIELDS)
    if unknown:
        raise InvalidRequest("unknown_field", f"unknown filter field(s): {', '.join(sorted(map(str, unknown)))[:300]}")
    agent = _text(body, "agent")
    error_key = _text(body, "error_key")
    kind = _text(body, "kind")
    if kind is not None and kind not in failures.PLATFORM_KINDS and kind not in declared_kinds(workspace):
        raise InvalidRequest(
            "invalid_kind",
            f"kind must be one of {', '.join(sorted(failures.PLATFORM_KINDS))}, or a kind an agent of this workspace declares",
        )
    version = _whole(body, "version", 1, 2**31 - 1)
    min_age = _whole(body, "min_age_seconds", 0, AGE_MAX_SECONDS)
    everything = body.get("all", False)
    if not isinstance(everything, bool):
        raise InvalidRequest("invalid_filter", "all must be true or false")
    mine = body.get("mine", False)
    if not isinstance(mine, bool) and mine is not None:
        raise InvalidRequest("invalid_filter", "mine must be true or false")
    creator = getattr(user, "pk", None) if mine else None
    if mine and creator is None:
        raise InvalidRequest("invalid_filter", "mine needs a signed-in person")
    hold_filter = HoldFilter(
        agent=agent,
        version=version,
        kind=kind,
        error_key=error_key,
        min_age_seconds=min_age,
        created_by=creator,
        runs=_run_ids(body),
        all=everything,
    )
    if hold_filter == HoldFilter():
        raise InvalidRequest(
            "empty_filter",
            "name runs or a filter (agent, version, kind, error_key, min_age_seconds, mine), or all: true for every held run",
        )
    return hold_filter


def _text(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > TEXT_MAX or "\x00" in value:
        raise InvalidRequest("invalid_filter", f"{name} must be a non-empty string of at most {TEXT_MAX} characters")
    return value.strip()


def _whole(body: Mapping[str, Any], name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    number = whole_number(value)  # JSON has one number type: 1.0 is 1, as the document's `integer` says
    if number is None or not low <= number <= high:
        raise InvalidRequest("invalid_filter", f"{name} must be a whole number from {low} to {high}")
    return number


def _run_ids(body: Mapping[str, Any]) -> tuple[uuid.UUID, ...] | None:
    value = body.get("runs")
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise InvalidRequest("invalid_filter", "runs must be a non-empty list of run ids")
    if len(value) > BULK_CAP:
        raise InvalidRequest("too_many_runs", f"at most {BULK_CAP} runs per request; {len(value)} were named")
    ids: dict[uuid.UUID, None] = {}
    for item in value:
        ids[_run_id(item)] = None
    return tuple(ids)


def _run_id(item: Any) -> uuid.UUID:
    if isinstance(item, str) and len(item) <= 40:
        try:
            return uuid.UUID(item)
        except ValueError:
            pass
    raise InvalidRequest("invalid_run_id", "runs must hold run ids (UUIDs)")


def held_runs_query(workspace: Workspace, hold_filter: HoldFilter) -> QuerySet[Run]:
    """The held runs a filter's run-level criteria choose, holding a failed task its task-level ones match."""
    runs = Run.objects.filter(workspace=workspace, status=RunStatus.NEEDS_ATTENTION)
    if hold_filter.agent is not None:
        runs = runs.filter(agent_name=hold_filter.agent)
    if hold_filter.version is not None:
        runs = runs.filter(agent_version__version=hold_filter.version)
    if hold_filter.min_age_seconds is not None:
        runs = runs.filter(held_since__lte=timezone.now() - timedelta(seconds=hold_filter.min_age_seconds))
    if hold_filter.created_by is not None:
        runs = runs.filter(created_by_id=hold_filter.created_by)
    if hold_filter.runs is not None:
        runs = runs.filter(pk__in=hold_filter.runs)
    return runs.filter(Exists(Task.objects.filter(hold_filter.task_q(), run=OuterRef("pk"))))


def repair_targets(runs: list[Run], hold_filter: HoldFilter) -> dict[Any, list[Task]]:
    """Each run's tasks a bulk verb acts on: its repair candidates (S15, S16) that match the filter."""
    ids = [run.pk for run in runs]
    candidates = repair_candidates_of(ids)
    targets: dict[Any, list[Task]] = {run_id: [] for run_id in ids}
    for task in Task.objects.filter(hold_filter.task_q(), run_id__in=ids).order_by("run_id", "position"):
        if task.key in candidates[task.run_id]:
            targets[task.run_id].append(task)
    return targets


def select_held_runs(
    workspace: Workspace, hold_filter: HoldFilter, *, user: Any = None, cap: int = BULK_CAP
) -> tuple[list[dict[str, Any]], bool]:
    """Up to `cap` held runs the filter chooses, oldest hold first, each with the tasks a bulk verb
    would act on, and whether more runs matched than the cap. A preview and the repair that follows
    read this same function. Each run says whose it is (creator, private, whether it is `user`'s)
    and its first target's failure message as `user` may read it (F11: none for a closed reader)."""
    query = held_runs_query(workspace, hold_filter).select_related("agent_version", "created_by", "workspace")
    runs = list(query.order_by("held_since", "id")[: cap + 1])
    more = len(runs) > cap
    runs = runs[:cap]
    targets = repair_targets(runs, hold_filter)
    stranding = deliverable_needs([run.pk for run in runs], [task.key for tasks in targets.values() for task in tasks])
    now = timezone.now()
    chosen = []
    for run in runs:
        tasks = targets[run.pk]
        if not tasks:
            continue  # a failed task that is no candidate (absorbed by a race, S16) is nothing to repair
        since = run.held_since or run.updated_at
        content = user is not None and can_read_content(user, run)
        chosen.append(
            {
                "run": str(run.pk),
                "agent": run.agent_name or None,
                "version": run.agent_version.version if run.agent_version else None,
                "task_keys": [task.key for task in tasks],
                "kinds": list(dict.fromkeys(failures.task_kind(task.error_key, task.result) for task in tasks)),
                "waited_seconds": max(0, int((now - since).total_seconds())),
                "since": since,
                # An abandon of these leaves the run held, its deliverable unresolved.
                "strands_deliverable": any(task.key in stranding[run.pk] for task in tasks),
                "creator": run.created_by.get_username() if run.created_by else None,
                "private": run.private,
                "mine": user is not None and run.created_by_id == getattr(user, "pk", None),
                "error_key": tasks[0].error_key,
                "message": tasks[0].error_detail if content else None,
                "content_visible": content,
            }
        )
    return chosen, more


def whose(chosen: list[dict[str, Any]]) -> dict[str, int]:
    """How many of the chosen runs are someone else's, and how many private: a filter that reaches
    past the person's own runs says so before the click."""
    return {
        "others": sum(1 for item in chosen if not item["mine"]),
        "private": sum(1 for item in chosen if item["private"]),
        "others_private": sum(1 for item in chosen if item["private"] and not item["mine"]),
    }


def held_agents(workspace: Workspace) -> list[str]:
    """The agents with held runs: the bulk filter's suggestions."""
    names = Run.objects.filter(workspace=workspace, status=RunStatus.NEEDS_ATTENTION).exclude(agent_name="")
    return list(names.order_by("agent_name").values_list("agent_name", flat=True).distinct()[:100])
