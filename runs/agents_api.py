"""The agents part of the JSON API (API.md): register and lint manifests, list the catalog's agents."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import Router, Schema

from runs import manifests
from runs.kernel.errors import Forbidden, NotFound
from runs.models import Agent, AgentVersion, Membership, Role
from runs.schemas import ErrorOut

router = Router(tags=["agents"])

ERRORS: dict[int, Any] = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut}


class ManifestIn(Schema):
    manifest: str


class ProblemOut(Schema):
    line: int
    field: str
    message: str


class RegisteredOut(Schema):
    name: str
    version: int
    created: bool
    warnings: list[ProblemOut]


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
    version: int
    model: str
    fallback_models: list[str]
    tools: list[str]
    failures: list[FailureOut]
    approval: dict[str, Any]
    created_at: str


class AgentPage(Schema):
    items: list[AgentOut]


class AgentDetail(AgentOut):
    instructions: str
    manifest: str
    versions: list[int]


def _require_operator_somewhere(user: Any) -> None:
    if not Membership.objects.filter(user_id=user.pk, role=Role.OPERATOR).exists():
        raise Forbidden("registering an agent needs operator standing in some workspace")


def _agent_document(version: AgentVersion) -> dict[str, Any]:
    manifest = version.manifest
    return {
        "name": version.agent.name,
        "version": version.version,
        "model": manifest.get("model", ""),
        "fallback_models": manifest.get("fallback_models", []),
        "tools": manifest.get("tools", []),
        "failures": manifest.get("failures", []),
        "approval": manifest.get("approval", {}),
        "created_at": version.created_at.isoformat(),
    }


@router.post("/agents", response={201: RegisteredOut, **ERRORS}, summary="Register an agent's manifest (F2-F8)")
def register_agent(request: HttpRequest, payload: ManifestIn) -> Any:
    """A changed manifest becomes the agent's next version; an unchanged one answers with the current version."""
    _require_operator_somewhere(request.user)
    try:
        registered = manifests.register(payload.manifest, request.user)
    except manifests.InvalidManifest as invalid:
        return _invalid(request, invalid.linted)
    body = {
        "name": registered.version.agent.name,
        "version": registered.version.version,
        "created": registered.created,
        "warnings": [w.as_dict() for w in registered.warnings],
    }
    # The contract answers 201 either way; `created` says whether this made a new version.
    return 201, body


def _invalid(request: HttpRequest, linted: manifests.Linted) -> HttpResponse:
    from oz0site.api import api

    errors = [e.as_dict() for e in linted.errors]
    detail = "; ".join(f"line {e.line}: {e}" for e in linted.errors)
    body = {
        "error": {"key": "invalid_manifest", "detail": detail, "errors": errors},
        "warnings": [w.as_dict() for w in linted.warnings],
    }
    return api.create_response(request, body, status=400)


@router.post("/agents/lint", response={200: LintOut, **ERRORS}, summary="Lint a manifest without registering it (F2-F8)")
def lint_agent(request: HttpRequest, payload: ManifestIn) -> dict[str, Any]:
    linted = manifests.lint(payload.manifest)
    return {"errors": [e.as_dict() for e in linted.errors], "warnings": [w.as_dict() for w in linted.warnings]}


@router.get("/agents", response={200: AgentPage, **ERRORS}, summary="The registered agents, each at its latest version")
def list_agents(request: HttpRequest) -> dict[str, Any]:
    latest = AgentVersion.objects.select_related("agent").order_by("agent__name", "-version").distinct("agent__name")
    return {"items": [_agent_document(v) for v in latest]}


@router.get("/agents/{name}", response={200: AgentDetail, **ERRORS}, summary="One agent at its latest version")
def get_agent(request: HttpRequest, name: str) -> dict[str, Any]:
    agent = Agent.objects.filter(name=name).first()
    if agent is None:
        raise NotFound("agent")
    versions = list(AgentVersion.objects.filter(agent=agent).order_by("-version"))
    if not versions:
        raise NotFound("agent")
    latest = versions[0]
    return {
        **_agent_document(latest),
        "instructions": latest.manifest.get("instructions", ""),
        "manifest": latest.manifest_text,
        "versions": [v.version for v in versions],
    }
