"""Who may see, lint, register and read agents, and the agents each caller sees.

Agents belong to a workspace. Members of a workspace (any role) see its agents' names,
models, tools, failure kinds and approval mode; an agent's words (instructions, the manifest
text with its script) are content, shown to readers and operators only; registering a version
needs operator standing in the agent's workspace.
"""

from __future__ import annotations

from typing import Any

from oz0agents.models import Agent, AgentVersion
from oz0agents.registry import latest_versions
from runs.kernel import Forbidden, InvalidRequest, NotFound
from tenancy.models import Membership, Role, Workspace
from tenancy.permissions import has_write_standing, role_of


def member_workspaces(user: Any) -> dict[int, str]:
    """The workspaces the user is a member of, in any role: id → slug."""
    if user is None or not user.is_authenticated:
        return {}
    return dict(Membership.objects.filter(user_id=user.pk).values_list("workspace_id", "workspace__slug"))


def _member_workspace(user: Any, slug: Any) -> Workspace:
    if not isinstance(slug, str) or not slug:
        raise InvalidRequest("invalid_field", "`workspace` must be a workspace's slug")
    workspace = Workspace.objects.filter(slug=slug).first()
    if workspace is None or role_of(user, workspace.pk) is None:
        raise NotFound("workspace")
    return workspace


def registering_workspace(user: Any, slug: Any = None) -> Workspace:
    """Where a manifest registers: the workspace named, which the user must operate; unnamed,
    the one workspace the user operates (naming it is required when they operate several)."""
    if slug is not None:
        workspace = _member_workspace(user, slug)
        if not has_write_standing(user, workspace.pk):
            raise Forbidden("registering an agent needs operator standing in its workspace")
        return workspace
    operated = list(Workspace.objects.filter(memberships__user_id=user.pk, memberships__role=Role.OPERATOR).order_by("slug")[:2])
    if not operated:
        raise Forbidden("registering an agent needs operator standing in a workspace")
    if len(operated) > 1:
        raise InvalidRequest(
            "workspace_required", "you operate more than one workspace: name the agent's workspace with `workspace`"
        )
    return operated[0]


def require_lint_standing(user: Any, slug: Any = None) -> Workspace | None:
    """Linting needs a role in the workspace named (returned), or in some workspace."""
    if slug is not None:
        return _member_workspace(user, slug)
    if not member_workspaces(user):
        raise Forbidden("linting a manifest needs a role in a workspace")
    return None


def visible_versions(user: Any, slug: str | None = None) -> list[AgentVersion]:
    """The newest version of every agent of the user's workspaces (or of the one named)."""
    if slug is not None:
        return latest_versions([_member_workspace(user, slug).pk])
    return latest_versions(member_workspaces(user))


def agent_for(user: Any, name: str, slug: str | None = None) -> Agent:
    """The agent of that name in the workspace named, or in the user's one workspace that has one.

    A non-member sees no agent (404); a name several of the user's workspaces use needs the
    workspace (`workspace_required`)."""
    if slug is not None:
        workspace = _member_workspace(user, slug)
        agent = Agent.objects.select_related("workspace").filter(workspace=workspace, name=name).first()
        if agent is None:
            raise NotFound("agent")
        return agent
    candidates = list(
        Agent.objects.select_related("workspace").filter(name=name, workspace_id__in=list(member_workspaces(user)))[:2]
    )
    if not candidates:
        raise NotFound("agent")
    if len(candidates) > 1:
        raise InvalidRequest(
            "workspace_required", f"more than one of your workspaces has an agent named {name!r}: name the workspace"
        )
    return candidates[0]


def can_read_agent_content(user: Any, agent: Agent) -> bool:
    """An agent's instructions and script are words: readers and operators of its workspace see them."""
    return role_of(user, agent.workspace_id) in (Role.READER, Role.OPERATOR)
