"""The catalog (F9, F13): every agent's declared failure kinds and the platform's kinds with their flags.

Read at request time, so a newly registered agent version shows at once in the
catalog and in the OpenAPI document's `x-oz0-failures`; both list the agents of the
caller's workspaces.
"""

from __future__ import annotations

from typing import Any

from oz0agents.access import visible_versions
from oz0agents.registry import declared_kinds, failures_by_agent
from runs.failures import PLATFORM_KINDS


def platform_kinds() -> list[dict[str, Any]]:
    return [
        {"kind": k.kind, "retryable": k.retryable, "partial": k.partial, "person": k.person, "when": k.when}
        for k in PLATFORM_KINDS.values()
    ]


def catalog(user: Any) -> dict[str, Any]:
    """The agents of the user's workspaces (agents belong to a workspace), and the platform's kinds."""
    rows = [
        {"name": v.agent.name, "workspace": v.agent.workspace.slug, "version": v.version, "failures": declared_kinds(v.manifest)}
        for v in visible_versions(user)
    ]
    return {"agents": rows, "platform_kinds": platform_kinds()}


def openapi_failures(user: Any) -> dict[str, list[str]]:
    """`x-oz0-failures`: the declared kinds of each agent the caller may see, by name (F13); a name
    two of the caller's workspaces use is keyed `workspace/name`. An anonymous caller sees none."""
    return failures_by_agent(visible_versions(user), lambda manifest: [row["kind"] for row in declared_kinds(manifest)])
