"""Which version of an agent a new run takes (issue 33 item 4): the stable version, or during a
canary rollout the canary on `canary_percent` of new runs, chosen by a hash of the run's id, so
the choice is deterministic (the same id always lands in the same arm) and recorded on the run
(`Run.rollout`)."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import Any

from oz0agents.models import Agent, AgentVersion

CANARY, STABLE = "canary", "stable"


def bucket(run_id: uuid.UUID | str) -> int:
    """0-99, uniform over run ids: the first 8 bytes of the SHA-256 of its text, modulo 100."""
    return int.from_bytes(hashlib.sha256(str(run_id).encode()).digest()[:8], "big") % 100


@dataclass(frozen=True)
class Assigned:
    version: AgentVersion | None
    arm: str  # CANARY, STABLE, or "" when no rollout is under way


def serving(agent: Agent) -> AgentVersion | None:
    """The version that takes every run but a canary's: the pinned stable one, else the newest."""
    if agent.stable_version is not None:
        return agent.stable_version
    return AgentVersion.objects.select_related("agent").filter(agent=agent).order_by("-version").first()


def assign(agent: Agent, run_id: uuid.UUID) -> Assigned:
    if agent.canary_version is None or agent.canary_percent <= 0:
        return Assigned(serving(agent), "")
    if bucket(run_id) < agent.canary_percent:
        return Assigned(agent.canary_version, CANARY)
    return Assigned(serving(agent), STABLE)


def pin(workspace: Any, name: str, version: int, arm: str) -> Assigned | None:
    """One named version of the workspace's agent, whatever its rollout assigns (an eval's runs),
    with the arm the run records (`Run.rollout`, at most 8 characters); None when there is none."""
    found = AgentVersion.objects.select_related("agent").filter(agent__workspace=workspace, agent__name=name, version=version)
    chosen = found.first()
    return Assigned(chosen, arm[:8]) if chosen is not None else None
