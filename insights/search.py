"""Job search over findings (F18): `finding:failure_not_found agent:triage version:3 since:2026-01-01`.

A query is terms `name:value` separated by spaces (quote a value with spaces). The
same term given twice matches either value (`finding:failure_a finding:failure_b`);
`since` and `until` may appear once. A kind is named as the chips show it or with the
`failure_` prefix of the seeds (`finding:not_found`, `finding:failure_not_found`).

Every other word is free text, searched in the failure messages (PostgreSQL full text,
`websearch_to_tsquery` over the index `run_failure_message_fts`): a quoted phrase is a
phrase, `-word` excludes. Free text matches only the runs whose words the searcher may
read (`runs.permissions.content_readable`), so for a viewer it matches nothing at all —
never fewer or more by what the hidden words say. A word shaped like a term whose name
is not one (`agnet:x`) is refused with `invalid_query`, naming it, before any row is read.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from typing import Any

from django.contrib.postgres.search import SearchQuery
from django.db.models import Q, QuerySet
from django.utils.dateparse import parse_date, parse_datetime

from runs.kernel import InvalidRequest, NotFound
from runs.models import FAILURE_MESSAGE_VECTOR, Finding, Run, TaskKind
from runs.permissions import content_readable
from runs.selectors import encode_cursor, invalid_cursor, keyset_position
from tenancy.models import Membership

KIND_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
TERMS = ("finding", "agent", "version", "since", "until", "step", "step_kind", "workspace")
FINDING_PREFIX = "failure_"
PAGE_MAX = 200
TEXT_MAX = 200
TERM_SHAPE = re.compile(r"^[a-z_]+:")
# The reader of the server's own command line (`manage.py job_search`): free text searches every run.
SERVER = object()


@dataclass
class Query:
    kinds: list[str] = field(default_factory=list)
    agents: list[str] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    step_kinds: list[str] = field(default_factory=list)
    workspaces: list[str] = field(default_factory=list)
    since: datetime | None = None
    until: datetime | None = None
    words: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The free text as websearch syntax: a word that held spaces was quoted, so it is a phrase."""
        return " ".join(f'"{w}"' if " " in w else w for w in self.words)


def invalid(detail: str) -> InvalidRequest:
    return InvalidRequest("invalid_query", detail)


def parse_moment(name: str, value: str, *, end_of_day: bool) -> datetime:
    """A date (`2026-01-31`, the whole day) or an ISO datetime; naive means UTC."""
    try:
        day: date | None = parse_date(value)
    except ValueError:
        day = None
    if day is not None:
        moment: datetime | None = datetime.combine(day, time.max if end_of_day else time.min)
    else:
        try:
            moment = parse_datetime(value)
        except ValueError:
            moment = None
    if moment is None:
        raise invalid(f"{name}:{value} is not a date (YYYY-MM-DD) or an ISO datetime")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        return moment.astimezone(UTC)
    except OverflowError:  # an offset that carries the instant past year 1 or 9999
        raise invalid(f"{name}:{value} is outside the years 1 to 9999") from None


def parse_query(text: str | None) -> Query:
    query = Query()
    try:
        words = shlex.split(text or "")
    except ValueError as error:
        raise invalid(f"the query does not parse: {error}") from None
    for word in words:
        if " " in word or not TERM_SHAPE.match(word):
            query.words.append(word)
            continue
        name, _, value = word.partition(":")
        if name not in TERMS:
            raise invalid(f"unknown term {name!r}; terms are {', '.join(TERMS)} (quote a phrase to search it as text)")
        if not value:
            raise invalid(f"the term {name}: has no value")
        if name == "finding":
            kinds = finding_kinds(value)
            if not kinds:
                raise invalid(f"finding:{value} is not a kind, e.g. finding:not_found or finding:failure_not_found")
            query.kinds.extend(kinds)
        elif name == "agent":
            query.agents.append(value)
        elif name == "version":
            if not value.isdigit() or len(value) > 9:
                raise invalid(f"version:{value} is not a version number")
            query.versions.append(int(value))
        elif name == "step":
            query.steps.append(value)
        elif name == "step_kind":
            if value not in TaskKind.values:
                raise invalid(f"step_kind:{value} is not a task kind ({', '.join(TaskKind.values)})")
            query.step_kinds.append(value)
        elif name == "workspace":
            query.workspaces.append(value)
        else:
            if getattr(query, name) is not None:
                raise invalid(f"{name}: may be given once")
            setattr(query, name, parse_moment(name, value, end_of_day=name == "until"))
    if query.since and query.until and query.since > query.until:
        raise invalid("since: is after until:")
    if len(query.text) > TEXT_MAX:
        raise invalid(f"the free text is longer than {TEXT_MAX} characters")
    return query


def finding_kinds(value: str) -> list[str]:
    """The kinds `finding:<value>` names: the chips' name (`unreadable`) or the seeds' (`failure_unreadable`);
    a declared kind that itself starts with `failure_` is matched by its own name too."""
    kinds = [value] if KIND_PATTERN.match(value) else []
    if value.startswith(FINDING_PREFIX) and KIND_PATTERN.match(value.removeprefix(FINDING_PREFIX)):
        kinds.append(value.removeprefix(FINDING_PREFIX))
    return kinds


def visible_workspaces(user: Any) -> dict[int, str]:
    """The workspaces whose findings the user may see: those they are a member of, in any role."""
    return dict(Membership.objects.filter(user_id=user.pk).values_list("workspace_id", "workspace__slug"))


def runs_saying(text: str, reader: Any, workspace_ids: list[int]) -> QuerySet[Run]:
    """The runs of those workspaces whose failure message matches `text` and whose words `reader` may read."""
    runs = Run.objects.filter(workspace_id__in=workspace_ids)
    if reader is not SERVER:
        runs = runs.filter(content_readable(reader))
    return runs.annotate(said=FAILURE_MESSAGE_VECTOR).filter(said=SearchQuery(text, config="simple", search_type="websearch"))


def findings_matching(
    query: Query, workspace_ids: list[int], *, reader: Any = None, agent: str | None = None
) -> QuerySet[Finding]:
    """The findings the query matches; free text needs the `reader` whose standing limits it."""
    rows = Finding.objects.filter(workspace_id__in=workspace_ids)
    if agent is not None:
        rows = rows.filter(agent_name=agent)
    if query.words:
        rows = rows.filter(run_id__in=runs_saying(query.text, reader, workspace_ids).values("id"))
    if query.kinds:
        rows = rows.filter(kind__in=query.kinds)
    if query.agents:
        rows = rows.filter(agent_name__in=query.agents)
    if query.versions:
        rows = rows.filter(agent_version__in=query.versions)
    if query.steps:
        rows = rows.filter(step_key__in=query.steps)
    if query.step_kinds:
        rows = rows.filter(step_kind__in=query.step_kinds)
    if query.since:
        rows = rows.filter(created_at__gte=query.since)
    if query.until:
        rows = rows.filter(created_at__lte=query.until)
    return rows


def finding_document(finding: Finding, workspaces: dict[int, str]) -> dict[str, Any]:
    """A finding as every member may see it: kind, flags, step and attempts; it holds no words."""
    return {
        "id": finding.pk,
        "run": str(finding.run_id),
        "workspace": workspaces.get(finding.workspace_id),
        "agent": finding.agent_name or None,
        "version": finding.agent_version,
        "kind": finding.kind,
        "retryable": finding.retryable,
        "partial": finding.partial,
        "person": finding.person,
        "declared": finding.declared,
        "step": {"key": finding.step_key, "kind": finding.step_kind} if finding.step_key else None,
        "error_key": finding.error_key or None,
        "attempts": finding.attempts,
        "created_at": finding.created_at.isoformat(),
    }


def search_findings(
    user: Any,
    text: str | None,
    *,
    cursor: str | None = None,
    limit: int = 50,
    workspace: str | None = None,
    agent: str | None = None,
) -> dict[str, Any]:
    """One page of the findings a query matches among the user's workspaces, newest first;
    `agent` scopes it to that agent's findings whatever the query says (a scorecard's box)."""
    workspaces = visible_workspaces(user)
    if workspace is not None and workspace not in workspaces.values():
        raise NotFound("workspace")
    return search_page(text, workspaces, cursor=cursor, limit=limit, workspace=workspace, reader=user, agent=agent)


def search_page(
    text: str | None,
    workspaces: dict[int, str],
    *,
    cursor: str | None = None,
    limit: int = 50,
    workspace: str | None = None,
    reader: Any = None,
    agent: str | None = None,
) -> dict[str, Any]:
    """One page over the given workspaces (id → slug), keyset-paged by (created_at, id). Free
    text matches only the runs `reader` may read (`SERVER`: every run); without a reader, none."""
    query = parse_query(text)
    filters = [set(query.workspaces)] if query.workspaces else []
    if workspace is not None:
        filters.append({workspace})
    if filters:
        # Every workspace filter must hold: disjoint ones (or a slug outside `workspaces`) match nothing.
        wanted = set.intersection(*filters)
        workspaces = {pk: slug for pk, slug in workspaces.items() if slug in wanted}
    limit = max(1, min(limit, PAGE_MAX))
    rows = findings_matching(query, list(workspaces), reader=reader, agent=agent)
    position = keyset_position(cursor)
    if position is not None:
        after, last_pk = position
        if not isinstance(last_pk, int) or isinstance(last_pk, bool) or not 0 < last_pk < 2**63:
            raise invalid_cursor()
        rows = rows.filter(Q(created_at__lt=after) | Q(created_at=after, pk__lt=last_pk))
    page = list(rows.order_by("-created_at", "-pk")[: limit + 1])
    more = len(page) > limit
    page = page[:limit]
    items = [finding_document(f, workspaces) for f in page]
    next_cursor = encode_cursor([page[-1].created_at.isoformat(), page[-1].pk]) if more and page else None
    return {"items": items, "next": next_cursor}
