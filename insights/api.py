"""The insights part of the JSON API: findings search, scorecards and the catalog (F9, F13, F18)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Query, Router, Schema
from pydantic import ConfigDict

from insights import catalog as catalog_module
from insights import search, selectors
from oz0site.auth import person_auth
from runs import selectors as run_selectors
from runs.kernel import InvalidRequest, NotFound
from runs.schemas import SLUG_QUERY, ErrorOut, Moment, Page, moment_text

router = Router(tags=["insights"])

ERRORS: dict[int, Any] = {400: ErrorOut, 401: ErrorOut, 404: ErrorOut}


class Open(Schema):
    model_config = ConfigDict(extra="allow")


class FindingOut(Open):
    id: int
    run: str
    workspace: str | None = None
    agent: str | None = None
    version: int | None = None
    kind: str
    retryable: bool
    partial: bool
    person: bool
    declared: bool
    step: dict[str, str] | None = None
    error_key: str | None = None
    attempts: int
    created_at: str


FindingPage = Page[FindingOut]


class KindCount(Open):
    kind: str
    failed: int
    rate: float | None = None
    retryable: bool | None = None
    partial: bool | None = None
    person: bool | None = None
    declared: bool


class Repairs(Open):
    retried: int
    abandoned: int
    after_hold: int
    hold_to_repair_mean_seconds: float | None = None
    hold_to_repair_max_seconds: float | None = None


class TrendDay(Open):
    day: str
    runs: int
    failed: int
    rate: float | None = None
    by_kind: dict[str, int]


class VersionCard(Open):
    version: int | None = None
    runs: int
    failed: int
    rate: float | None = None
    by_kind: list[KindCount]
    repairs: Repairs


class ScorecardOut(Open):
    agent: str
    version: int | None = None
    since: str | None = None
    until: str | None = None
    runs: int
    failed: int
    rate: float | None = None
    by_kind: list[KindCount]
    versions: list[VersionCard]
    trend: list[TrendDay]
    repairs: Repairs


class DeclaredKind(Schema):
    kind: str
    description: str
    retryable: bool
    partial: bool
    person: bool


class PlatformKind(Schema):
    kind: str
    retryable: bool
    partial: bool
    person: bool
    when: str


class CatalogAgent(Schema):
    name: str
    workspace: str
    version: int
    failures: list[DeclaredKind]


class CatalogOut(Schema):
    agents: list[CatalogAgent]
    platform_kinds: list[PlatformKind]


@router.get(
    "/findings",
    auth=person_auth(rate="read"),
    response={200: FindingPage, **ERRORS},
    summary="Search failed runs' findings (F18)",
)
def findings(
    request: HttpRequest,
    q: str = "",
    cursor: str | None = None,
    limit: int = 50,
    workspace: str | None = Query(None, **SLUG_QUERY),
) -> dict[str, Any]:
    """`q` is terms like `finding:failure_not_found agent:triage version:2 since:2026-01-01 until:... step:KEY step_kind:round`."""
    return search.search_findings(request.user, q, cursor=cursor, limit=limit, workspace=workspace)


@router.get(
    "/insights/agents/{agent}",
    auth=person_auth(rate="read"),
    response={200: ScorecardOut, **ERRORS},
    summary="An agent's scorecard (F18)",
)
def agent_scorecard(
    request: HttpRequest,
    agent: str,
    version: int | None = Query(None, ge=1),
    since: Moment | None = None,
    until: Moment | None = None,
    workspace: str | None = Query(None, **SLUG_QUERY),
) -> dict[str, Any]:
    """Over the caller's workspaces, or the one named: agents belong to a workspace, and a name
    two of them use counts both agents' runs."""
    since_text, until_text = moment_text(since), moment_text(until)
    since_at = search.parse_moment("since", since_text, end_of_day=False) if since_text else None
    until_at = search.parse_moment("until", until_text, end_of_day=True) if until_text else None
    if version is not None and version < 1:
        raise InvalidRequest("invalid_query", "version must be a positive number")
    if workspace is not None:
        workspace_ids = [run_selectors.workspace_for(request.user, workspace).pk]
    else:
        workspace_ids = selectors.member_workspace_ids(request.user)
    if not workspace_ids:
        raise NotFound("agent")
    return selectors.scorecard(agent, version, since_at, until_at, workspace_ids=workspace_ids)


@router.get(
    "/catalog",
    auth=person_auth(rate="read"),
    response={200: CatalogOut, 401: ErrorOut},
    summary="Agents with their failure kinds, and the platform's kinds (F9, F13)",
)
def catalog(request: HttpRequest) -> dict[str, Any]:
    return catalog_module.catalog(request.user)
