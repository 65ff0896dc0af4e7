"""The catalog (F9, F13): every agent's declared failure kinds and the platform's kinds with their flags.

Read at request time, so a newly registered agent version shows at once in the
catalog and in the OpenAPI document's `x-oz0-failures`.
"""

from __future__ import annotations

from typing import Any

from runs.failures import PLATFORM_KINDS
from runs.models import AgentVersion

FLAGS = ("retryable", "partial", "person")


def declared_kinds(manifest: Any) -> list[dict[str, Any]]:
    """An agent's `failures:` as the catalog shows them: kind, description and the three flags (F2)."""
    rows = []
    for declared in (manifest or {}).get("failures", []) or []:
        if not isinstance(declared, dict) or not isinstance(declared.get("kind"), str):
            continue
        rows.append(
            {
                "kind": declared["kind"],
                "description": str(declared.get("description", "")),
                **{flag: bool(declared.get(flag, False)) for flag in FLAGS},
            }
        )
    return rows


def latest_versions() -> list[AgentVersion]:
    """Each agent's newest version, by name."""
    return list(AgentVersion.objects.select_related("agent").order_by("agent__name", "-version").distinct("agent__name"))


def platform_kinds() -> list[dict[str, Any]]:
    return [
        {"kind": k.kind, "retryable": k.retryable, "partial": k.partial, "person": k.person, "when": k.when}
        for k in PLATFORM_KINDS.values()
    ]


def catalog() -> dict[str, Any]:
    agents = [{"name": v.agent.name, "version": v.version, "failures": declared_kinds(v.manifest)} for v in latest_versions()]
    return {"agents": agents, "platform_kinds": platform_kinds()}


def openapi_failures() -> dict[str, list[str]]:
    """`x-oz0-failures`: each agent's declared kinds by name (F13)."""
    return {v.agent.name: [row["kind"] for row in declared_kinds(v.manifest)] for v in latest_versions()}
