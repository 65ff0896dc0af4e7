"""The registry of agent versions: registering a manifest as its agent's next version, and the
reads of what is registered (each agent's newest version, the failure kinds a version declares).

Runs record the version they ran; the kernel and the worker read `AgentVersion.manifest`, the
normalized document `oz0agents.lint` produced.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from oz0agents import rollouts
from oz0agents.code_version import code_digest
from oz0agents.lint import FAILURE_FLAGS, InvalidManifest, lint
from oz0agents.models import Agent, AgentVersion
from oz0agents.parsing import Problem
from tenancy.models import Workspace


def digest(manifest: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class Registered:
    version: AgentVersion
    created: bool
    warnings: list[Problem]


def register(text: Any, user: Any = None, *, workspace: Workspace, canary: int | None = None) -> Registered:
    """Store the manifest as the workspace's agent's next version when it changed (runs record
    the version they ran). With `canary` (a percentage), a new version starts on that share of
    new runs beside the version serving until now (oz0agents.rollouts); without, it serves all.

    Raises `InvalidManifest` listing every error. `user` is whoever registers: the caller
    checks their standing in `workspace`, which the agent belongs to.
    """
    if canary is not None:
        canary = rollouts.checked_percent(canary)
    linted = lint(text, known_agents=agents_of(workspace))
    if not linted.ok:
        raise InvalidManifest(linted)
    manifest = linted.manifest
    assert manifest is not None
    manifest_digest = digest(manifest)
    # The code's version as it is now: a version is its manifest, so registering the same manifest
    # again keeps the version (and the digest it was registered with); runs record their own.
    code = code_digest(manifest)
    for _ in range(3):
        try:
            with transaction.atomic():
                agent, _ = Agent.objects.get_or_create(workspace=workspace, name=manifest["name"])
                # Serialize registrations of one agent: the version number is a counter.
                agent = (
                    Agent.objects.select_for_update(of=("self",))
                    .select_related("stable_version", "canary_version")
                    .get(pk=agent.pk)
                )
                latest = AgentVersion.objects.filter(agent=agent).order_by("-version").first()
                if latest is not None and latest.digest == manifest_digest:
                    return Registered(latest, False, linted.warnings)
                version = AgentVersion.objects.create(
                    agent=agent,
                    version=(latest.version if latest else 0) + 1,
                    manifest_text=text,
                    manifest=manifest,
                    digest=manifest_digest,
                    code_digest=code,
                )
                rollouts.registered(agent, version, latest, user, canary)
                return Registered(version, True, linted.warnings)
        except IntegrityError:  # a concurrent first registration of the same name: try again
            continue
    raise RuntimeError(f"could not register agent {manifest['name']!r}")


def agents_of(workspace: Workspace) -> Callable[[set[str]], set[str]]:
    """Which of some names are agents (or flows) of the workspace: what a flow's steps may name."""

    def known(names: set[str]) -> set[str]:
        return set(Agent.objects.filter(workspace=workspace, name__in=sorted(names)).values_list("name", flat=True))

    return known


def latest_versions(workspace_ids: Iterable[int]) -> list[AgentVersion]:
    """Each agent's newest version, among the agents of these workspaces, by name then workspace."""
    rows: QuerySet[AgentVersion] = (
        AgentVersion.objects.select_related("agent", "agent__workspace")
        .filter(agent__workspace_id__in=list(workspace_ids))
        .order_by("agent__name", "agent__workspace__slug", "agent_id", "-version")
        .distinct("agent__name", "agent__workspace__slug", "agent_id")
    )
    return list(rows)


def declared_kinds(manifest: Any) -> list[dict[str, Any]]:
    """A version's `failures:` as the catalog shows them: kind, description and the three flags (F2)."""
    rows = []
    for declared in (manifest or {}).get("failures", []) or []:
        if not isinstance(declared, dict) or not isinstance(declared.get("kind"), str):
            continue
        rows.append(
            {
                "kind": declared["kind"],
                "description": str(declared.get("description", "")),
                **{flag: bool(declared.get(flag, False)) for flag in FAILURE_FLAGS},
            }
        )
    return rows


def failures_by_agent(versions: list[AgentVersion], kinds_of: Callable[[Any], Any]) -> dict[str, Any]:
    """`{name: kinds}` for the given versions; a name two of them share is keyed `workspace/name`."""
    names: dict[str, int] = {}
    for version in versions:
        names[version.agent.name] = names.get(version.agent.name, 0) + 1
    result: dict[str, Any] = {}
    for version in versions:
        name = version.agent.name
        key = name if names[name] == 1 else f"{version.agent.workspace.slug}/{name}"
        result[key] = kinds_of(version.manifest)
    return result
