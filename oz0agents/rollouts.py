"""Canary rollouts (issue 33 item 4), their state: a version registered as a canary takes a share
of its agent's new runs (oz0agents.assignment) while the stable version takes the rest; an
operator promotes it or rolls it back in one action. The two arms' numbers and the sweep that rolls
a failing canary back by itself read runs, so they are the insights app's (insights.canary).

Every change leaves a `RolloutEvent` (the rollout's audit trail) in the same transaction; an
automatic rollback is news to the workspace's `rollback` subscribers (notify.digests).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from oz0agents.models import Agent, AgentVersion, RolloutEvent
from runs.kernel import Conflict, InvalidRequest, NotFound, whole_number
from tenancy.models import Workspace

SYSTEM_ACTOR = "oz0"
AUTO_ROLLED_BACK = "auto_rolled_back"
# The verbs of the trail.
VERBS = ("canary_started", "promoted", "rolled_back", AUTO_ROLLED_BACK, "superseded")


def actor_name(user: Any) -> str:
    return str(getattr(user, "username", "") or SYSTEM_ACTOR)


def checked_percent(value: Any) -> int:
    number = whole_number(value)
    if number is None or not 1 <= number <= 99:
        raise InvalidRequest("invalid_field", "`canary` must be a whole percentage from 1 to 99")
    return number


def event(
    agent: Agent, actor: str, verb: str, canary: AgentVersion | None, stable: AgentVersion | None, **data: Any
) -> RolloutEvent:
    return RolloutEvent.objects.create(
        workspace_id=agent.workspace_id,
        agent=agent,
        agent_name=agent.name,
        actor=actor,
        verb=verb,
        canary_version=canary.version if canary else None,
        stable_version=stable.version if stable else None,
        data=data,
    )


def registered(agent: Agent, version: AgentVersion, previous: AgentVersion | None, user: Any, canary: int | None) -> None:
    """A new version was registered (inside the registration's transaction, the agent's row
    locked): with `canary`, it starts on that share of new runs beside the version that served
    until now; without, it serves every new run, ending any canary."""
    actor = actor_name(user)
    if canary and previous is not None:
        stable = agent.stable_version or previous
        if agent.canary_version is not None:
            event(agent, actor, "superseded", agent.canary_version, stable)
        agent.stable_version, agent.canary_version = stable, version
        agent.canary_percent, agent.canary_since = canary, timezone.now()
        agent.save(update_fields=["stable_version", "canary_version", "canary_percent", "canary_since"])
        event(agent, actor, "canary_started", version, stable, percent=canary)
        return
    if agent.canary_version is not None:
        event(agent, actor, "superseded", agent.canary_version, agent.stable_version, by=version.version)
    if agent.stable_version is not None or agent.canary_version is not None:
        clear(agent, stable=None)


def clear(agent: Agent, *, stable: AgentVersion | None) -> None:
    """No canary any more; `stable` (None: the newest version) serves every new run."""
    agent.stable_version, agent.canary_version, agent.canary_percent, agent.canary_since = stable, None, 0, None
    agent.save(update_fields=["stable_version", "canary_version", "canary_percent", "canary_since"])


def locked(**lookup: Any) -> Agent | None:
    """The agent's row, locked for the transaction, with its two versions."""
    return (
        Agent.objects.select_for_update(of=("self",)).select_related("stable_version", "canary_version").filter(**lookup).first()
    )


def _locked(workspace: Workspace, name: str) -> Agent:
    agent = locked(workspace=workspace, name=name)
    if agent is None:
        raise NotFound("agent")
    return agent


def promote(*, workspace: Workspace, user: Any, name: str) -> Agent:
    """The canary takes every new run; the trail says who promoted it. Caller checks operator standing."""
    with transaction.atomic():
        agent = _locked(workspace, name)
        canary, stable = agent.canary_version, agent.stable_version
        if canary is None:
            raise Conflict("no_canary", f"agent {name!r} has no canary to promote")
        clear(agent, stable=canary)
        event(agent, actor_name(user), "promoted", canary, stable)
    return agent


def rollback(*, workspace: Workspace, user: Any, name: str) -> Agent:
    """The stable version takes every new run again (the canary's runs go on as they are)."""
    with transaction.atomic():
        agent = _locked(workspace, name)
        canary, stable = agent.canary_version, agent.stable_version
        if canary is None:
            raise Conflict("no_canary", f"agent {name!r} has no canary to roll back")
        clear(agent, stable=stable)
        event(agent, actor_name(user), "rolled_back", canary, stable)
    return agent


def events(workspace: Workspace, name: str | None = None, limit: int = 50) -> list[RolloutEvent]:
    rows = RolloutEvent.objects.filter(workspace=workspace)
    if name is not None:
        rows = rows.filter(agent_name=name)
    return list(rows.order_by("-created_at", "-id")[:limit])


def event_document(row: RolloutEvent) -> dict[str, Any]:
    return {
        "at": row.created_at.isoformat(),
        "agent": row.agent_name,
        "actor": row.actor,
        "verb": row.verb,
        "canary_version": row.canary_version,
        "stable_version": row.stable_version,
        "data": row.data,
    }
