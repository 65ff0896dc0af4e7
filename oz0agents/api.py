"""The agents part of the JSON API (API.md): register and lint manifests, list and read a workspace's agents."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Query, Router, Schema, Status
from pydantic import Field, StrictInt, field_validator

from oz0agents import access
from oz0agents.lint import InvalidManifest, Linted, lint
from oz0agents.models import Agent, AgentVersion
from oz0agents.registry import agents_of, register
from oz0site.auth import person_auth
from runs.kernel import MAX_PAYLOAD_BYTES, NotFound
from runs.schemas import SLUG_PATTERN, SLUG_QUERY, ErrorBody, ErrorOut, Page
from tenancy.models import Workspace

router = Router(tags=["agents"])

# A manifest carries an agent's instructions: its bodies keep the row store's cap, not a verb's.
# Linting names its workspace in the body (or none), so its standing is the body's to say, after
# the parse; registering needs operator standing somewhere before the body is read.
MANIFEST_BODY_MAX = MAX_PAYLOAD_BYTES

ERRORS: dict[int, Any] = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut}


class ManifestIn(Schema):
    manifest: str = Field(min_length=1)
    # The agent's workspace; left out, the one workspace the caller operates (lint: any role).
    workspace: str | None = Field(default=None, min_length=1, max_length=64, pattern=SLUG_PATTERN)


class CanaryIn(Schema):
    # Register a new version as a canary on this share of new runs (oz0agents.rollouts).
    canary: StrictInt | None = Field(default=None, ge=1, le=99)

    @field_validator("canary", mode="before")
    @classmethod
    def _whole_number(cls, canary: Any) -> Any:
        # JSON has one number type: 10.0 is 10 (JSON Schema's `integer` says so); 10.5, "10" and true are refused.
        return int(canary) if isinstance(canary, float) and canary.is_integer() else canary


class RegisterIn(ManifestIn, CanaryIn):
    pass


class WorkspaceManifestIn(CanaryIn):
    manifest: str = Field(min_length=1)


class ProblemOut(Schema):
    line: int
    field: str
    message: str


class RegisteredOut(Schema):
    name: str
    workspace: str
    version: int
    created: bool
    warnings: list[ProblemOut]
    # The share of new runs the new version takes as a canary; null when it serves them all.
    canary: int | None = None


class InvalidManifestError(ErrorBody):
    # Every error of the manifest (`invalid_manifest`); absent from the endpoint's other 400s.
    errors: list[ProblemOut] = []


class InvalidManifestOut(Schema):
    error: InvalidManifestError
    warnings: list[ProblemOut] = []


class LintOut(Schema):
    errors: list[ProblemOut]
    warnings: list[ProblemOut]


class FailureOut(Schema):
    kind: str
    description: str
    retryable: bool
    partial: bool
    person: bool


class AgentOut(Schema):
    name: str
    workspace: str
    version: int
    model: str
    fallback_models: list[str]
    tools: list[str]
    failures: list[FailureOut]
    approval: dict[str, Any]
    created_at: str


# Every agent of the caller's workspaces: one page, `next` null.
AgentPage = Page[AgentOut]


class AgentDetail(AgentOut):
    # The agent's words: null for a viewer, who sees no content.
    instructions: str | None
    manifest: str | None
    content_visible: bool
    versions: list[int]
    # The version new runs take (the newest unless a rollout pinned another), and a canary under
    # way: {version, percent, since} or null (oz0agents.rollouts; its numbers: GET .../rollout).
    serving_version: int | None = None
    canary: dict[str, Any] | None = None


def _agent_document(version: AgentVersion) -> dict[str, Any]:
    manifest = version.manifest
    return {
        "name": version.agent.name,
        "workspace": version.agent.workspace.slug,
        "version": version.version,
        "model": manifest.get("model", ""),
        "fallback_models": manifest.get("fallback_models", []),
        "tools": manifest.get("tools", []),
        "failures": manifest.get("failures", []),
        "approval": manifest.get("approval", {}),
        "created_at": version.created_at.isoformat(),
    }


def _register(request: HttpRequest, text: str, workspace: Workspace, canary: int | None = None) -> Any:
    try:
        registered = register(text, request.user, workspace=workspace, canary=canary)
    except InvalidManifest as invalid:
        return Status(400, _invalid(invalid.linted))
    agent = Agent.objects.get(pk=registered.version.agent_id)
    body = {
        "name": registered.version.agent.name,
        "workspace": workspace.slug,
        "version": registered.version.version,
        "created": registered.created,
        "warnings": [w.as_dict() for w in registered.warnings],
        "canary": agent.canary_percent if agent.canary_version_id == registered.version.pk else None,
    }
    # The contract answers 201 either way; `created` says whether this made a new version.
    return Status(201, body)


@router.post(
    "/agents",
    auth=person_auth("operator", where="any", body_max=MANIFEST_BODY_MAX, rate="write"),
    response={**ERRORS, 201: RegisteredOut, 400: InvalidManifestOut},
    summary="Register an agent's manifest (F2-F8)",
)
def register_agent(request: HttpRequest, payload: RegisterIn) -> Any:
    """A changed manifest becomes the agent's next version; an unchanged one answers with the current version.

    The agent belongs to `workspace` (left out: the one workspace the caller operates), where the
    caller needs operator standing."""
    return _register(request, payload.manifest, access.registering_workspace(request.user, payload.workspace), payload.canary)


@router.post(
    "/workspaces/{ws}/agents",
    auth=person_auth("operator", where="ws", body_max=MANIFEST_BODY_MAX, rate="write"),
    response={**ERRORS, 201: RegisteredOut, 400: InvalidManifestOut},
    summary="Register an agent of a workspace (F2-F8)",
)
def register_workspace_agent(request: HttpRequest, ws: str, payload: WorkspaceManifestIn) -> Any:
    return _register(request, payload.manifest, access.registering_workspace(request.user, ws), payload.canary)


def _invalid(linted: Linted) -> dict[str, Any]:
    errors = [e.as_dict() for e in linted.errors]
    detail = "; ".join(f"line {e.line}: {e}" for e in linted.errors)
    body = {
        "error": {"key": "invalid_manifest", "detail": detail, "errors": errors},
        "warnings": [w.as_dict() for w in linted.warnings],
    }
    return body


@router.post(
    "/agents/lint",
    auth=person_auth(body_max=MANIFEST_BODY_MAX, rate="write"),
    response={200: LintOut, **ERRORS},
    summary="Lint a manifest without registering it (F2-F8)",
)
def lint_agent(request: HttpRequest, payload: ManifestIn) -> dict[str, Any]:
    """Needs a role (any) in the workspace named, or in some workspace."""
    workspace = access.require_lint_standing(request.user, payload.workspace)
    # Naming a workspace lints a flow's steps against its agents, as registering there would.
    linted = lint(payload.manifest, known_agents=agents_of(workspace) if workspace is not None else None)
    return {"errors": [e.as_dict() for e in linted.errors], "warnings": [w.as_dict() for w in linted.warnings]}


@router.get(
    "/agents",
    auth=person_auth(rate="read"),
    response={200: AgentPage, **ERRORS},
    summary="The agents of your workspaces, each at its latest version",
)
def list_agents(request: HttpRequest, workspace: str | None = Query(None, **SLUG_QUERY)) -> dict[str, Any]:
    return {"items": [_agent_document(v) for v in access.visible_versions(request.user, workspace)]}


@router.get(
    "/workspaces/{ws}/agents",
    auth=person_auth("viewer", where="ws", rate="read"),
    response={200: AgentPage, **ERRORS},
    summary="A workspace's agents",
)
def list_workspace_agents(request: HttpRequest, ws: str) -> dict[str, Any]:
    return {"items": [_agent_document(v) for v in access.visible_versions(request.user, ws)]}


def _detail(request: HttpRequest, agent: Agent) -> dict[str, Any]:
    versions = list(AgentVersion.objects.select_related("agent", "agent__workspace").filter(agent=agent).order_by("-version"))
    if not versions:
        raise NotFound("agent")
    latest = versions[0]
    content = access.can_read_agent_content(request.user, agent)
    return {
        **_agent_document(latest),
        "instructions": latest.manifest.get("instructions", "") if content else None,
        "manifest": latest.manifest_text if content else None,
        "content_visible": content,
        "versions": [v.version for v in versions],
        **_rollout_state(agent, latest),
    }


def _rollout_state(agent: Agent, latest: AgentVersion) -> dict[str, Any]:
    agent = Agent.objects.select_related("stable_version", "canary_version").get(pk=agent.pk)
    canary = agent.canary_version
    return {
        "serving_version": (agent.stable_version or latest).version,
        "canary": {"version": canary.version, "percent": agent.canary_percent, "since": agent.canary_since.isoformat()}
        if canary is not None and agent.canary_since is not None
        else None,
    }


@router.get("/agents/{name}", response={200: AgentDetail, **ERRORS}, summary="One agent at its latest version")
def get_agent(request: HttpRequest, name: str, workspace: str | None = Query(None, **SLUG_QUERY)) -> dict[str, Any]:
    """The agent of that name in `workspace`, or in the one of your workspaces that has one.
    Its instructions and manifest text are content: null for a viewer."""
    return _detail(request, access.agent_for(request.user, name, workspace))


@router.get("/workspaces/{ws}/agents/{name}", response={200: AgentDetail, **ERRORS}, summary="One agent of a workspace")
def get_workspace_agent(request: HttpRequest, ws: str, name: str) -> dict[str, Any]:
    return _detail(request, access.agent_for(request.user, name, ws))
