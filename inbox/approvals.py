"""What an approval card shows beside the call, and approving many identical calls in one step.

Context (issue 30): the agent's version, whether the tool is replayable (a call that is not has
effects: the console asks for a confirmation), the words the model said when it composed the call
(its round's last answer, the run's content: only for those who may read it, F11/F12), and how
many identical calls (same tool, same argument digest) wait in the workspace for this person.

Approve many: the calls identical to one (its digest, across runs), each approved through the
kernel under its own run's lock and bound to that digest; a call decided or changed meanwhile is
told as what happened to it, never approved blind.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from django.db.models import Count, F, Q
from django.db.models.fields.json import KT

from inbox.owners import decidable_by_groups, first_approval_of
from runs import kernel
from runs.models import Run, Task, TaskStatus, TraceEvent
from runs.permissions import can_read_content, walled_off
from tenancy.models import Workspace
from tenancy.permissions import has_write_standing

# The most calls one "approve many" step decides (each is its own transaction).
APPROVE_MANY_MAX = 100
MESSAGE_MAX = 4000
FIRST_OF_TWO = "your approval is the first of two: the call runs once a second, different approver approves it"
# How many of the oldest pending calls an inbox page looks through to count identical ones.
IDENTICAL_SCAN = 2000


def authoring_round(key: str) -> str | None:
    """The round that composed a call: a call's key is `<round>.<n>`."""
    head, dot, tail = key.rpartition(".")
    return head if dot and tail.isdigit() else None


def model_messages(pairs: Iterable[tuple[Any, str]]) -> dict[tuple[str, str], str | None]:
    """The words of each (run, round)'s last answer (one query, on the trace's (run, task_key, seq)
    index): the model's text beside the calls it composed; None when it said nothing."""
    wanted = {(str(run), key) for run, key in pairs}
    if not wanted:
        return {}
    where = Q()
    for run, key in wanted:
        where |= Q(run_id=run, task_key=key)
    rows = (
        TraceEvent.objects.filter(where, event="provider_call")
        .alias(outcome=KT("data__outcome"))
        .filter(outcome="answer")
        .order_by("run_id", "task_key", "-seq")
        .distinct("run_id", "task_key")
        .values_list("run_id", "task_key", KT("data__answer__text"))
    )
    found: dict[tuple[str, str], str | None] = {}
    for run, key, text in rows:
        found[(str(run), key)] = text[:MESSAGE_MAX] if isinstance(text, str) and text.strip() else None
    return found


def decidable(user: Any, workspace_ids: Sequence[int]) -> Q:
    """Pending calls this person may approve: model-composed, waiting, in a workspace where they
    operate, in a run whose words they may read (someone else's private run is never decided blind)."""
    operated = [pk for pk in workspace_ids if has_write_standing(user, pk)]
    return (
        Q(
            status=TaskStatus.NEEDS_APPROVAL,
            composed=True,
            run__workspace_id__in=operated,
        )
        & (Q(run__private=False) | Q(run__created_by_id=user.pk))
        & ~walled_off(user, "run__")
        # A call an approver group owns is its members' to decide (tenancy/approvers.py).
        & decidable_by_groups(user, operated)
    )


def identical_counts(user: Any, items: Sequence[dict[str, Any]], workspace_ids: Sequence[int]) -> tuple[dict[str, int], bool]:
    """How many pending calls share each shown approval's digest, per digest, and whether the
    counts are lower bounds. Nothing indexes a call's digest, so the count looks at the
    IDENTICAL_SCAN oldest pending calls (the park-clock index, in wait order) rather than every one:
    bounded cost whatever the inbox's size; the preview lists every identical call."""
    shown = {item["digest"]: item for item in items if item.get("digest")}
    if not shown:
        return {}, False
    oldest = list(
        Task.objects.filter(decidable(user, workspace_ids), deadline_at__isnull=False)
        .order_by("deadline_at", "pk")
        .values_list("pk", flat=True)[: IDENTICAL_SCAN + 1]
    )
    capped = len(oldest) > IDENTICAL_SCAN
    rows = (
        Task.objects.filter(pk__in=oldest[:IDENTICAL_SCAN], spec__tool__in=sorted({str(i["tool"]) for i in shown.values()}))
        .exclude(spec__has_key="native")
        .values(tool=KT("spec__tool"), args=F("spec__args"))
        .annotate(n=Count("pk"))
        .order_by()
    )
    counts: dict[str, int] = defaultdict(int)
    for row in rows:
        counts[kernel.call_digest(row["tool"], row["args"])] += row["n"]
    return dict(counts), capped


def add_context(user: Any, items: list[dict[str, Any]], tasks: dict[str, Task]) -> None:
    """Fill each approval item with its context (`tasks`: the item's task by item id, run loaded)."""
    approvals = [item for item in items if item["kind"] == "approval"]
    readable = [item for item in approvals if item.get("content_visible")]
    messages = model_messages((item["run"], authoring_round(item["task"]) or "") for item in readable)
    workspaces = sorted({tasks[item["id"]].run.workspace_id for item in approvals if item.get("actionable")})
    counts, capped = (
        identical_counts(user, [i for i in approvals if i.get("actionable")], workspaces) if workspaces else ({}, False)
    )
    for item in approvals:
        task = tasks[item["id"]]
        item["replayable"] = kernel.call_replayable(task.kind, task.spec)
        item["native"] = bool(task.spec.get("native"))
        if item.get("content_visible"):
            item["model_message"] = messages.get((item["run"], authoring_round(item["task"]) or ""))
        if item.get("actionable"):
            item["identical"] = counts.get(item["digest"], 1)
            item["identical_capped"] = capped


def identical_calls(user: Any, workspace: Workspace, run_id: Any, key: str) -> dict[str, Any]:
    """The pending calls identical to one (same tool and digest) that this person may approve, in
    the workspace, oldest park first, at most APPROVE_MANY_MAX: what an "approve many" previews.
    `anchor` is None when the call itself is no longer pending (decided meanwhile)."""
    anchor = (
        Task.objects.filter(decidable(user, [workspace.pk]), run_id=run_id, key=key)
        .exclude(spec__has_key="native")
        .select_related("run")
        .first()
    )
    if anchor is None:
        return {"anchor": None, "calls": [], "more": False}
    digest = kernel.spec_digest(anchor.spec)
    tasks = list(
        Task.objects.filter(
            decidable(user, [workspace.pk]), spec__tool=anchor.spec.get("tool"), spec__args=anchor.spec.get("args") or {}
        )
        .exclude(spec__has_key="native")
        .select_related("run", "run__agent_version")
        .order_by("deadline_at", "pk")[: APPROVE_MANY_MAX + 1]
    )
    # jsonb equality is looser than the digest (1 equals 1.0): the digest decides.
    same = [t for t in tasks if kernel.spec_digest(t.spec) == digest and can_read_content(user, t.run)]
    return {
        "anchor": anchor,
        "digest": digest,
        "tool": anchor.spec.get("tool"),
        "args": anchor.spec.get("args"),
        "replayable": kernel.call_replayable(anchor.kind, anchor.spec),
        "calls": [call_row(t) for t in same[:APPROVE_MANY_MAX]],
        "more": len(tasks) > APPROVE_MANY_MAX,
    }


def calls_with_digest(user: Any, workspace: Workspace, tool: str, digest: str) -> dict[str, Any]:
    """The pending calls of `tool` whose digest is `digest` that this person may approve in the
    workspace, oldest park first, at most APPROVE_MANY_MAX (`more`: there are more): what the API's
    approve-many previews and decides. Nothing indexes a call's digest, so it looks through the
    IDENTICAL_SCAN oldest pending calls of the tool (`scan_capped`: there were more to look at;
    decide these, then ask again)."""
    window = list(
        Task.objects.filter(decidable(user, [workspace.pk]), spec__tool=tool)
        .exclude(spec__has_key="native")
        .order_by("deadline_at", "pk")
        .values_list("pk", "spec__args")[: IDENTICAL_SCAN + 1]
    )
    matching = [pk for pk, args in window[:IDENTICAL_SCAN] if kernel.call_digest(tool, args) == digest]
    tasks = list(
        Task.objects.filter(pk__in=matching[: APPROVE_MANY_MAX + 1])
        .select_related("run", "run__agent_version")
        .order_by("deadline_at", "pk")
    )
    same = [t for t in tasks if can_read_content(user, t.run)]
    return {
        "tool": tool,
        "digest": digest,
        "replayable": kernel.call_replayable(same[0].kind, same[0].spec) if same else None,
        "calls": [call_row(t) for t in same[:APPROVE_MANY_MAX]],
        "more": len(matching) > APPROVE_MANY_MAX,
        "scan_capped": len(window) > IDENTICAL_SCAN,
    }


def call_row(task: Task) -> dict[str, Any]:
    run: Run = task.run
    return {
        "run": str(run.pk),
        "task": task.key,
        "agent": run.agent_name or None,
        "agent_version": run.agent_version.version if run.agent_version_id else None,  # type: ignore[union-attr]
        "deadline": task.deadline_at.isoformat() if task.deadline_at else None,
    }


def is_call_ref(run_id: str, key: str) -> bool:
    return _is_uuid(run_id) and 0 < len(key) <= 200


def parse_calls(values: Sequence[str]) -> list[tuple[str, str]]:
    """`<run id>:<task key>` pairs from a form; anything else is a typed refusal."""
    if not values:
        raise kernel.InvalidRequest("missing_field", "choose at least one call to approve")
    if len(values) > APPROVE_MANY_MAX:
        raise kernel.InvalidRequest("too_many_calls", f"at most {APPROVE_MANY_MAX} calls in one step")
    pairs = []
    for value in values:
        run, sep, key = value.partition(":")
        if not sep or not is_call_ref(run, key):
            raise kernel.InvalidRequest("invalid_field", f"{value[:80]!r} is not <run id>:<task key>")
        pairs.append((run, key))
    return list(dict.fromkeys(pairs))


def approve_calls(
    user: Any, workspace: Workspace, calls: Sequence[tuple[str, str]], *, digest: Any, confirm_effects: bool
) -> list[dict[str, Any]]:
    """Approve each call bound to `digest` (the one the preview showed), each in its own run's
    transaction; what happened to each: `approved`, `first_approval` (a call that needs two approvers
    waits for a second), or the kernel's refusal (`not_pending` when
    someone decided it meanwhile, `approval_stale` when it changed, `not_found`, ...)."""
    if not kernel.is_digest(digest):
        raise kernel.InvalidRequest("invalid_field", "`digest` must be the 64 lowercase hex characters the preview showed")
    runs = {
        str(pk)
        for pk in Run.objects.filter(workspace=workspace, pk__in=[run for run, _ in calls if _is_uuid(run)]).values_list(
            "pk", flat=True
        )
    }
    outcomes = []
    for run, key in calls:
        outcome: dict[str, Any] = {"run": run, "task": key}
        if run not in runs:
            outcome |= {"outcome": "not_found", "detail": "not in this workspace, or not yours to see"}
        else:
            try:
                kernel.approve(run_id=run, key=key, user=user, digest=digest, confirm_effects=confirm_effects)
            except kernel.KernelError as error:
                outcome |= {"outcome": error.key, "detail": error.detail}
            else:
                # A call that needs two approvers still waits after the first one.
                if first_approval_of(run, key, user):
                    outcome |= {"outcome": "first_approval", "detail": FIRST_OF_TWO}
                else:
                    outcome["outcome"] = "approved"
        outcomes.append(outcome)
    return outcomes


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True
