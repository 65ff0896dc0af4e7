"""Kernel transitions of runner calls (S8, S10): an executor claims an advertised call under a
lease, renews it, and loses it by expiry or revocation.

An advertised call is a `tool` task in `dispatched` with no claim (the kernel's `scheduling.start` puts it
there). A claim keeps it `dispatched` and sets `claim` to the executor's lease and
`heartbeat_at`; the result goes through `task_complete` / `task_fail`, which accept a dispatched
call with its claim. Each change runs under the run's row lock, compare-and-set on
(status, claim), with its trace event in the same transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from runs.kernel.commit import locked, sweep_each, sweep_stale_holders
from runs.kernel.failure import is_replayable
from runs.kernel.scheduling import after_failure, approval_holds, tool_deadline
from runs.kernel.txn import Txn
from runs.kernel.worker import Claimed, claimed_from
from runs.models import Executor, RunStatus, Task, TaskStatus
from tenancy.models import Membership, Role

CLAIMABLE_RUN_STATUSES = (RunStatus.RUNNING, RunStatus.NEEDS_ATTENTION)
CLAIM_PREFIX = "executor:"
# How many advertised calls one claim request looks at before answering "nothing for you".
CLAIM_SCAN = 20


def lease_seconds() -> float:
    return float(settings.OZ0_LEASE_SECONDS)


def claim_prefix(executor_id: Any) -> str:
    return f"{CLAIM_PREFIX}{executor_id}:"


@dataclass(frozen=True)
class LeasedCall:
    task_id: int
    run_id: str
    key: str
    tool: str
    args: dict[str, Any]
    attempt: int
    claim: str
    lease_expires_at: datetime


def addressed_to(task: Task) -> str | None:
    """The executor a call is addressed to, when its args name one (`executor`)."""
    target = (task.spec.get("args") or {}).get("executor")
    return str(target) if target else None


def claim_call(
    *, executor_id: Any, executor_name: str, tools: Iterable[str], workspace_ids: Iterable[int], owner_id: Any
) -> LeasedCall | None:
    """Hand the oldest advertised call this executor serves to it, under a fresh lease.

    A private run's calls go only to executors its creator registered: its tool args are its
    content, which nobody else may read (F11)."""
    tools = list(tools)
    workspace_ids = list(workspace_ids)
    if not tools or not workspace_ids:
        return None
    candidates = list(
        Task.objects.filter(
            kind="tool",
            status=TaskStatus.DISPATCHED,
            claim__isnull=True,
            spec__tool__in=tools,
            run__workspace_id__in=workspace_ids,
            run__status__in=CLAIMABLE_RUN_STATUSES,
        )
        .filter(Q(run__private=False) | Q(run__created_by_id=owner_id))
        .filter(Q(spec__args__executor__isnull=True) | Q(spec__args__executor=str(executor_id)))
        .order_by("started_at", "pk")
        .values_list("pk", "run_id")[:CLAIM_SCAN]
    )
    for task_id, run_id in candidates:
        with locked(run_id, f"executor {executor_name or executor_id}") as txn:
            if txn.run.status not in CLAIMABLE_RUN_STATUSES:
                continue
            if txn.run.private and txn.run.created_by_id != owner_id:
                continue
            claim = f"{claim_prefix(executor_id)}{uuid.uuid4().hex[:16]}"
            task = Task.objects.filter(pk=task_id, status=TaskStatus.DISPATCHED, claim__isnull=True).first()
            if task is None:
                continue
            target = addressed_to(task)
            if target is not None and target != str(executor_id):
                continue
            txn.remember([task])
            if not approval_holds(txn, task) or task.status != TaskStatus.DISPATCHED:
                continue
            attempt = task.attempt + 1
            taken = Task.objects.filter(pk=task_id, status=TaskStatus.DISPATCHED, claim__isnull=True).update(
                claim=claim,
                heartbeat_at=txn.now,
                attempt=attempt,
                started_at=txn.now,
                cancel_requested=False,
                deadline_at=tool_deadline(task.spec, txn.now),
            )
            if taken != 1:
                continue
            txn.event(task.key, "executor_claimed", data={"executor": str(executor_id), "attempt": attempt})
            return LeasedCall(
                task_id=task.pk,
                run_id=str(task.run_id),
                key=task.key,
                tool=str(task.spec.get("tool")),
                args=dict(task.spec.get("args") or {}),
                attempt=attempt,
                claim=claim,
                lease_expires_at=txn.now + timedelta(seconds=lease_seconds()),
            )
    return None


def renew_lease(task_id: int, claim_of: str) -> tuple[bool, bool]:
    """Heartbeat a claimed call: (still held, stop requested). `claim_of` is the executor's claim prefix."""
    now = timezone.now()
    updated = Task.objects.filter(pk=task_id, status=TaskStatus.DISPATCHED, claim__startswith=claim_of).update(heartbeat_at=now)
    if not updated:
        return False, True
    cancel = bool(Task.objects.filter(pk=task_id).values_list("cancel_requested", flat=True).first())
    return True, cancel


def held_call(task_id: int, claim_of: str) -> Claimed | None:
    """The call an executor holds (its claim starts with `claim_of`), as the worker protocol's
    `Claimed` its report is keyed by; None when it holds none."""
    task = Task.objects.filter(pk=task_id, status=TaskStatus.DISPATCHED, claim__startswith=claim_of).first()
    if task is None or task.claim is None:
        return None
    return claimed_from(task)


def _lose_lease(txn: Txn, task: Task, reason: str) -> None:
    """A lease ended with no result: a replayable call is advertised again; a non-replayable one
    becomes `uncertain` for a person to decide (S10) — nothing re-runs it blind."""
    if task.cancel_requested or txn.run.status == RunStatus.CANCELING:
        txn.move(
            task,
            TaskStatus.CANCELED,
            error=("run_canceled", "the executor stopped"),
            claim=None,
            heartbeat_at=None,
            finished_at=txn.now,
        )
        return
    if is_replayable(task):
        Task.objects.filter(pk=task.pk, status=TaskStatus.DISPATCHED, claim=task.claim).update(
            claim=None, heartbeat_at=None, deadline_at=None, queued_at=txn.now
        )
        txn.event(task.key, "claim_expired", data={"claim": task.claim, "replayed": True, "reason": reason})
        task.claim = None
        return
    txn.event(task.key, "claim_expired", data={"claim": task.claim, "replayed": False, "reason": reason})
    detail = (
        "the executor's lease expired with no result"
        if reason == "lease_expired"
        else "the executor was revoked while it held the call"
    )
    txn.move(task, TaskStatus.UNCERTAIN, error=("tool_uncertain", detail), claim=None, heartbeat_at=None, finished_at=txn.now)
    after_failure(txn, task)


def sweep_expired_leases(now: datetime | None = None) -> int:
    """Claimed runner calls whose executor stopped heartbeating (S10)."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=lease_seconds())
    stale = Task.objects.filter(
        status=TaskStatus.DISPATCHED, kind="tool", claim__startswith=CLAIM_PREFIX, heartbeat_at__lt=cutoff
    )
    return sweep_stale_holders(stale, lambda txn, task: _lose_lease(txn, task, "lease_expired"))


def revoke_calls(
    *,
    executor_id: Any,
    orphaned_tools: Iterable[str],
    workspace_ids: Iterable[int],
    owner_id: Any = None,
    private_orphaned_tools: Iterable[str] = (),
) -> int:
    """An executor was revoked: its claimed calls lose their lease, and the unclaimed calls
    addressed to it fail with `executor_revoked` — those naming it, those of shared runs whose
    tool no other live executor serves (`orphaned_tools`), and those of its owner's private runs
    whose tool no other live executor of the owner serves (`private_orphaned_tools`). Returns how
    many calls failed."""
    failed = 0
    prefix = claim_prefix(executor_id)
    held = list(Task.objects.filter(status=TaskStatus.DISPATCHED, claim__startswith=prefix).values_list("pk", "run_id", "claim"))
    for task_id, run_id, claim in held:
        with locked(run_id, "revoke") as txn:
            task = Task.objects.filter(pk=task_id, status=TaskStatus.DISPATCHED, claim=claim).first()
            if task is None:
                continue
            txn.remember([task])
            _lose_lease(txn, task, "executor_revoked")
    orphaned = list(orphaned_tools)
    private_orphaned = list(private_orphaned_tools)
    scope = list(workspace_ids)
    addressed = Q(spec__args__executor=str(executor_id))
    if orphaned:
        addressed |= Q(spec__tool__in=orphaned, run__workspace_id__in=scope, run__private=False)
    if private_orphaned and owner_id is not None:
        addressed |= Q(
            spec__tool__in=private_orphaned, run__workspace_id__in=scope, run__private=True, run__created_by_id=owner_id
        )
    unclaimed = list(
        Task.objects.filter(kind="tool", status=TaskStatus.DISPATCHED, claim__isnull=True)
        .filter(addressed)
        .values_list("pk", "run_id")
    )
    for task_id, run_id in unclaimed:
        with locked(run_id, "revoke") as txn:
            task = Task.objects.filter(pk=task_id, status=TaskStatus.DISPATCHED, claim__isnull=True).first()
            if task is None:
                continue
            txn.remember([task])
            txn.move(
                task,
                TaskStatus.FAILED,
                error=("executor_revoked", "the executor this call was addressed to was removed before it claimed the call"),
                finished_at=txn.now,
            )
            after_failure(txn, task)
            failed += 1
    return failed


def sweep_unserved_calls(now: datetime | None = None) -> int:
    """Advertised runner calls nobody serves: a call that has waited OZ0_UNSERVED_SECONDS with no live
    executor able to claim it (one that serves its tool for its workspace, or the one it is addressed
    to, seen within that time) fails `tool_not_served` under its own policy. Returns how many failed."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=float(settings.OZ0_UNSERVED_SECONDS))
    waiting = list(
        Task.objects.filter(kind="tool", status=TaskStatus.DISPATCHED, claim__isnull=True, queued_at__lt=cutoff)
        .order_by("queued_at")
        .values_list("pk", "run_id", "run__workspace_id", "run__private", "run__created_by_id", "spec")
    )
    if not waiting:
        return 0
    live = list(
        Executor.objects.filter(revoked=False, last_heartbeat_at__gte=cutoff).values_list(
            "pk", "owner_id", "workspace_id", "tools"
        )
    )
    operated: dict[int, set[int]] = {}
    for user_id, workspace_id in Membership.objects.filter(
        user_id__in={owner for _, owner, _, _ in live}, role=Role.OPERATOR
    ).values_list("user_id", "workspace_id"):
        operated.setdefault(user_id, set()).add(workspace_id)

    def served(workspace_id: int, creator_only: Any, spec: dict[str, Any]) -> bool:
        """The claim rule of `claim_call`: tool, scope, operator standing, address, and a private
        run's calls for its creator's executors only."""
        target = (spec.get("args") or {}).get("executor")
        return any(
            spec.get("tool") in tools
            and (scope is None or scope == workspace_id)
            and workspace_id in operated.get(owner, set())
            and (not target or str(target) == str(executor_id))
            and (creator_only is None or owner == creator_only)
            for executor_id, owner, scope, tools in live
        )

    def fail_unserved(txn: Txn, task_and_spec: tuple[int, dict[str, Any]]) -> bool:
        task_id, spec = task_and_spec
        task = Task.objects.filter(pk=task_id, status=TaskStatus.DISPATCHED, claim__isnull=True, queued_at__lt=cutoff).first()
        if task is None or txn.run.status == RunStatus.CANCELING:
            return False
        txn.remember([task])
        error = ("tool_not_served", f"no live executor served {spec.get('tool')!r} for {settings.OZ0_UNSERVED_SECONDS:g} s")
        txn.move(task, TaskStatus.FAILED, error=error, finished_at=txn.now)
        after_failure(txn, task)
        return True

    unserved = (
        (run_id, (task_id, spec))
        for task_id, run_id, workspace_id, private, creator_id, spec in waiting
        if not served(workspace_id, creator_id if private else None, spec)
    )
    return sweep_each(unserved, "sweep", fail_unserved)
