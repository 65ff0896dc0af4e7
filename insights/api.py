"""The insights part of the JSON API: findings search, scorecards, failure groups and the catalog (F9, F13, F18)."""

from __future__ import annotations

from typing import Any, Literal

from django.http import HttpRequest
from ninja import Query, Router, Schema
from pydantic import ConfigDict, Field, StrictInt, field_validator

from insights import canary, groups, numbers, search, selectors
from insights import catalog as catalog_module
from oz0agents import rollouts
from oz0agents.access import agent_for
from oz0agents.models import Agent
from oz0site.auth import person_auth
from runs import selectors as run_selectors
from runs.kernel import InvalidRequest, NotFound
from runs.schemas import SLUG_QUERY, ErrorOut, Moment, Page, moment_text

router = Router(tags=["insights"])

ERRORS: dict[int, Any] = {400: ErrorOut, 401: ErrorOut, 404: ErrorOut}
WRITE_ERRORS: dict[int, Any] = {**ERRORS, 403: ErrorOut, 413: ErrorOut}


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


class UsageCost(Open):
    """Model calls' tokens and their cost in dollars (text, six places; null when no model of
    them has a known price in genai-prices), and the models with no known price."""

    input_tokens: int
    output_tokens: int
    calls: int
    cost_usd: str | None = None
    unpriced_models: list[str]


class CodeCount(Open):
    """The runs of a version that ran one version of its code (its digest, null: no code found)."""

    digest: str | None = None
    runs: int
    first_run_at: str | None = None
    # The code the version was registered with; false: the code changed under the same manifest.
    registered: bool
    usage: UsageCost


class VersionCard(Open):
    version: int | None = None
    runs: int
    failed: int
    rate: float | None = None
    by_kind: list[KindCount]
    repairs: Repairs
    # All-time totals: null on a windowed scorecard.
    code: list[CodeCount] | None = None
    usage: UsageCost | None = None


class GroupOut(Open):
    """A failure group: what every member sees — kind, error key, counts, versions, when."""

    id: int
    workspace: str | None = None
    agent: str | None = None
    kind: str
    error_key: str | None = None
    failed: int
    runs: int
    first_seen: str
    last_seen: str
    first_version: int | None = None
    last_version: int | None = None
    resolved_in_version: int | None = None
    resolved_at: str | None = None
    regressed: bool


GroupPage = Page[GroupOut]


class GroupVersion(Schema):
    version: int | None = None
    failed: int
    first_seen: str
    last_seen: str


class GroupExample(Schema):
    run: str
    version: int | None = None
    created_at: str


class GroupDetailOut(GroupOut):
    versions: list[GroupVersion]
    examples: list[GroupExample]
    shape: str | None = Field(
        None,
        description="The message with numbers, ids and quoted values masked; null unless you may read an example run's words",
    )


class TopGroup(Open):
    id: int
    kind: str
    error_key: str | None = None
    failed: int
    first_seen: str
    last_seen: str
    versions: list[int | None]
    resolved_in_version: int | None = None
    regressed: bool


class ResolveIn(Schema):
    model_config = ConfigDict(extra="forbid")

    version: StrictInt | None = Field(
        ..., ge=1, le=groups.VERSION_MAX, description="The agent version the group is fixed in; null opens it again"
    )

    @field_validator("version", mode="before")
    @classmethod
    def _whole_number(cls, version: Any) -> Any:
        # JSON has one number type: 2.0 is the version 2 (JSON Schema's `integer` says so); 2.5 and true are refused.
        return int(version) if isinstance(version, float) and version.is_integer() else version


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
    usage: UsageCost | None = None
    groups: list[TopGroup]


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
    agent: str | None = Query(None, max_length=100),
) -> dict[str, Any]:
    """`q` is terms like `finding:not_found agent:triage version:2 since:2026-01-01 until:... step:KEY step_kind:round`,
    and free text searched in the failure messages of the runs whose words you may read (a quoted
    phrase, `-word` to exclude). `agent` scopes the search to that agent whatever `q` says."""
    return search.search_findings(request.user, q, cursor=cursor, limit=limit, workspace=workspace, agent=agent)


@router.get(
    "/insights/groups",
    auth=person_auth(rate="read"),
    response={200: GroupPage, **ERRORS},
    summary="Failure groups, most recently seen first",
)
def failure_groups(
    request: HttpRequest,
    agent: str | None = Query(None, max_length=100),
    workspace: str | None = Query(None, **SLUG_QUERY),
    cursor: str | None = None,
    limit: int = 50,
) -> dict[str, Any]:
    """Failures of the same kind, agent, error key and message shape, over the caller's workspaces
    (or the one named). Every member sees kinds and counts; no group carries words."""
    workspaces = search.visible_workspaces(request.user)
    if workspace is not None:
        run_selectors.workspace_for(request.user, workspace)
        workspaces = {pk: slug for pk, slug in workspaces.items() if slug == workspace}
    return groups.list_groups(request.user, workspace_ids=workspaces, agent=agent, cursor=cursor, limit=limit)


@router.get(
    "/insights/groups/{group_id}",
    auth=person_auth(rate="read"),
    response={200: GroupDetailOut, **ERRORS},
    summary="A failure group: versions affected, example runs, and its shape for those who may read it",
)
def failure_group(request: HttpRequest, group_id: int) -> dict[str, Any]:
    return groups.group_detail(request.user, group_id)


@router.post(
    "/insights/groups/{group_id}/resolve",
    auth=person_auth(rate="write", body_max=1024),
    response={200: GroupDetailOut, **WRITE_ERRORS},
    summary="Mark a failure group resolved in a version (null reopens it); needs the operator role",
)
def resolve_group(request: HttpRequest, group_id: int, payload: ResolveIn) -> dict[str, Any]:
    """A finding of a later version then flags the group `regressed`."""
    return groups.resolve(request.user, group_id, payload.version)


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
    workspace_ids = _agent_workspace_ids(request, workspace)
    return selectors.scorecard(agent, version, since_at, until_at, workspace_ids=workspace_ids)


def _agent_workspace_ids(request: HttpRequest, workspace: str | None) -> list[int]:
    """The workspace named (its 404 for an outsider), else every one of the caller's; none: the agent's 404."""
    if workspace is not None:
        return [run_selectors.workspace_for(request.user, workspace).pk]
    workspace_ids = selectors.member_workspace_ids(request.user)
    if not workspace_ids:
        raise NotFound("agent")
    return workspace_ids


class NumbersOut(Open):
    range: dict[str, Any]
    runs: int
    failed: int
    low: float | None
    versions: list[dict[str, Any]]
    trend: list[dict[str, Any]]


# The document says what a range takes (the presets, the buckets, a day's shape); whether a day is
# one of the calendar, and the range's rules, insights.numbers.parse_range checks and tells.
DAY_TEXT: dict[str, Any] = {"pattern": r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}


@router.get(
    "/insights/agents/{agent}/numbers",
    auth=person_auth(rate="read"),
    response={200: NumbersOut, **ERRORS},
    summary="An agent's runs, failures (with the Wilson bound), tokens, cost and durations in a range, per version and bucket",
)
def agent_numbers(
    request: HttpRequest,
    agent: str,
    days: Literal["7", "30", "90"] | None = None,
    since: str | None = Query(None, alias="from", **DAY_TEXT),
    until: str | None = Query(None, alias="to", **DAY_TEXT),
    bucket: Literal["day", "week"] | None = None,
    version: int | None = Query(None, ge=1),
    workspace: str | None = Query(None, **SLUG_QUERY),
) -> dict[str, Any]:
    """`days` 7, 30 or 90, or `from`/`to` (YYYY-MM-DD, at most 366 days), and `bucket` day or week:
    UTC days, weeks from Monday. Counts only, never words: the same for every member's role."""
    given = {"days": days, "from": since, "to": until, "bucket": bucket}
    period = numbers.parse_range({key: value for key, value in given.items() if value is not None})
    workspace_ids = _agent_workspace_ids(request, workspace)
    doc = numbers.agent_numbers(agent, period, version=version, workspace_ids=workspace_ids)
    if not doc["versions"] and not Agent.objects.filter(name=agent, workspace_id__in=workspace_ids).exists():
        raise NotFound("agent")
    return doc


@router.get(
    "/catalog",
    auth=person_auth(rate="read"),
    response={200: CatalogOut, 401: ErrorOut},
    summary="Agents with their failure kinds, and the platform's kinds (F9, F13)",
)
def catalog(request: HttpRequest) -> dict[str, Any]:
    return catalog_module.catalog(request.user)


# --- canary rollouts (insights.canary, oz0agents.rollouts) --------------------------------


ROLLOUT_ERRORS: dict[int, Any] = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut}


class ArmKindOut(Schema):
    kind: str
    failed: int


class ArmOut(Schema):
    version: int | None
    runs: int
    decided: int
    failed: int
    failure_rate: float | None
    # The Wilson interval of the failure rate (insights.numbers.wilson); null without decided runs.
    interval: list[float] | None
    kinds: list[ArmKindOut]


class CanaryOut(Schema):
    version: int
    percent: int
    since: str
    arms: dict[str, ArmOut]
    breach: bool


class RolloutEventOut(Schema):
    at: str
    agent: str
    actor: str
    verb: str
    canary_version: int | None
    stable_version: int | None
    data: dict[str, Any]


class RolloutOut(Schema):
    agent: str
    stable_version: int | None
    canary: CanaryOut | None
    policy: dict[str, Any]
    events: list[RolloutEventOut]


def _rollout(agent: Agent) -> dict[str, Any]:
    agent = Agent.objects.select_related("workspace", "stable_version", "canary_version").get(pk=agent.pk)
    return {
        **canary.document(agent),
        "events": [rollouts.event_document(e) for e in rollouts.events(agent.workspace, agent.name)],
    }


@router.get(
    "/workspaces/{ws}/agents/{name}/rollout",
    auth=person_auth("viewer", where="ws", rate="read"),
    response={200: RolloutOut, **ROLLOUT_ERRORS},
    summary="An agent's rollout: its stable version, a canary's arms side by side, the trail",
)
def get_rollout(request: HttpRequest, ws: str, name: str) -> dict[str, Any]:
    return _rollout(agent_for(request.user, name, ws))


@router.post(
    "/workspaces/{ws}/agents/{name}/rollout/promote",
    auth=person_auth("operator", where="ws", rate="write", body_max=1024),
    response={200: RolloutOut, **ROLLOUT_ERRORS},
    summary="Promote an agent's canary: it takes every new run",
)
def promote_canary(request: HttpRequest, ws: str, name: str) -> dict[str, Any]:
    agent = agent_for(request.user, name, ws)
    return _rollout(rollouts.promote(workspace=agent.workspace, user=request.user, name=agent.name))


@router.post(
    "/workspaces/{ws}/agents/{name}/rollout/rollback",
    auth=person_auth("operator", where="ws", rate="write", body_max=1024),
    response={200: RolloutOut, **ROLLOUT_ERRORS},
    summary="Roll an agent's canary back: the stable version takes every new run",
)
def rollback_canary(request: HttpRequest, ws: str, name: str) -> dict[str, Any]:
    agent = agent_for(request.user, name, ws)
    return _rollout(rollouts.rollback(workspace=agent.workspace, user=request.user, name=agent.name))
