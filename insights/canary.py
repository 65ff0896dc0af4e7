"""Canary rollouts (issue 33 item 4), their numbers: the two arms side by side, and the beat sweep
that rolls a canary back by itself when it fails more than the stable version by
OZ0_CANARY_MARGIN once each arm has OZ0_CANARY_MIN_RUNS decided runs (the state and the trail are
oz0agents.rollouts').

A run is *decided* once it completed or has a failure (a hold, or an end on one); it *failed* when
it has a failure. Only runs created since the canary started count, each arm its own version's
runs assigned to it (`Run.rollout`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q

from insights.numbers import wilson
from oz0agents import rollouts
from oz0agents.assignment import CANARY, STABLE, serving
from oz0agents.models import Agent, AgentVersion, RolloutEvent
from runs.models import Run, RunStatus


@dataclass(frozen=True)
class Arm:
    version: int | None
    runs: int
    decided: int
    failed: int
    kinds: dict[str, int]

    @property
    def rate(self) -> float | None:
        return self.failed / self.decided if self.decided else None

    def document(self) -> dict[str, Any]:
        interval = wilson(self.failed, self.decided)
        return {
            "version": self.version,
            "runs": self.runs,
            "decided": self.decided,
            "failed": self.failed,
            "failure_rate": round(self.rate, 4) if self.rate is not None else None,
            "interval": [round(interval[0], 4), round(interval[1], 4)] if interval else None,
            "kinds": [{"kind": k, "failed": n} for k, n in sorted(self.kinds.items(), key=lambda i: (-i[1], i[0]))],
        }


def arm(agent: Agent, name: str, version: AgentVersion | None, since: datetime) -> Arm:
    rows = Run.objects.filter(workspace_id=agent.workspace_id, agent_name=agent.name, rollout=name, created_at__gte=since)
    if version is not None:
        rows = rows.filter(agent_version=version)
    totals = rows.aggregate(
        runs=Count("pk"),
        failed=Count("pk", filter=Q(failure__isnull=False)),
        completed=Count("pk", filter=Q(failure__isnull=True, status=RunStatus.COMPLETED)),
    )
    kinds = Counter(str(kind or "unknown") for kind in rows.filter(failure__isnull=False).values_list("failure__kind", flat=True))
    failed = int(totals["failed"])
    return Arm(version.version if version else None, int(totals["runs"]), failed + int(totals["completed"]), failed, dict(kinds))


def policy() -> dict[str, Any]:
    return {"margin": float(settings.OZ0_CANARY_MARGIN), "min_runs": int(settings.OZ0_CANARY_MIN_RUNS)}


def breach(canary: Arm, stable: Arm) -> bool:
    """Whether the canary fails more than the stable version by the margin, over enough runs."""
    rules = policy()
    if canary.decided < rules["min_runs"] or stable.decided < rules["min_runs"]:
        return False
    assert canary.rate is not None and stable.rate is not None
    return canary.rate - stable.rate > rules["margin"]


def document(agent: Agent) -> dict[str, Any]:
    """The agent's rollout: the serving version, a canary under way with both arms' numbers."""
    stable = serving(agent)
    doc: dict[str, Any] = {
        "agent": agent.name,
        "stable_version": stable.version if stable else None,
        "canary": None,
        "policy": policy(),
    }
    if agent.canary_version is not None and agent.canary_since is not None:
        canary_arm, stable_arm = (
            arm(agent, CANARY, agent.canary_version, agent.canary_since),
            arm(agent, STABLE, stable, agent.canary_since),
        )
        doc["canary"] = {
            "version": agent.canary_version.version,
            "percent": agent.canary_percent,
            "since": agent.canary_since.isoformat(),
            "arms": {CANARY: canary_arm.document(), STABLE: stable_arm.document()},
            "breach": breach(canary_arm, stable_arm),
        }
    return doc


# --- the sweep -------------------------------------------------------------------------------


def sweep() -> list[RolloutEvent]:
    """Roll back every canary that breaches the policy: one transaction each, the agent's row
    locked and the numbers read again under it, so two sweeps roll back once."""
    done: list[RolloutEvent] = []
    for pk in Agent.objects.filter(canary_version__isnull=False).values_list("pk", flat=True):
        with transaction.atomic():
            agent = (
                Agent.objects.select_for_update(of=("self",))
                .select_related("stable_version", "canary_version")
                .filter(pk=pk)
                .first()
            )
            if agent is None or agent.canary_version is None or agent.canary_since is None:
                continue
            canary, stable = agent.canary_version, serving(agent)
            canary_arm, stable_arm = (
                arm(agent, CANARY, canary, agent.canary_since),
                arm(agent, STABLE, stable, agent.canary_since),
            )
            if not breach(canary_arm, stable_arm):
                continue
            worst = (
                Run.objects.filter(agent_version=canary, rollout=CANARY, created_at__gte=agent.canary_since)
                .filter(failure__isnull=False)
                .order_by("-created_at")
                .values_list("pk", flat=True)
                .first()
            )
            rollouts.clear(agent, stable=agent.stable_version)
            done.append(
                rollouts.event(
                    agent,
                    rollouts.SYSTEM_ACTOR,
                    rollouts.AUTO_ROLLED_BACK,
                    canary,
                    stable,
                    canary_arm=canary_arm.document(),
                    stable_arm=stable_arm.document(),
                    policy=policy(),
                    run=str(worst) if worst else None,
                )
            )
    return done
