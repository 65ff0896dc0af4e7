"""The catalog (F9, F13): every agent's declared failure kinds and the platform's kinds with their flags.

Read at request time, so a newly registered agent version shows at once in the
catalog and in the OpenAPI document's `x-oz0-failures`; both list the agents of the
caller's workspaces.
"""

from __future__ import annotations

from typing import Any

from runs import agents
from runs.failures import PLATFORM_KINDS

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


def platform_kinds() -> list[dict[str, Any]]:
    return [
        {"kind": k.kind, "retryable": k.retryable, "partial": k.partial, "person": k.person, "when": k.when}
        for k in PLATFORM_KINDS.values()
    ]


def catalog(user: Any) -> dict[str, Any]:
    """The agents of the user's workspaces (agents belong to a workspace), and the platform's kinds."""
    rows = [
        {"name": v.agent.name, "workspace": v.agent.workspace.slug, "version": v.version, "failures": declared_kinds(v.manifest)}
        for v in agents.visible_versions(user)
    ]
    return {"agents": rows, "platform_kinds": platform_kinds()}


def openapi_failures(user: Any) -> dict[str, list[str]]:
    """`x-oz0-failures`: the declared kinds of each agent the caller may see, by name (F13); a name
    two of the caller's workspaces use is keyed `workspace/name`. An anonymous caller sees none."""
    return agents.failures_by_agent(
        agents.visible_versions(user), lambda manifest: [row["kind"] for row in declared_kinds(manifest)]
    )
