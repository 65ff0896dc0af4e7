"""A workspace's runs, newest first, a keyset page at a time: the console's runs list and
GET /api/v1/workspaces/{ws}/runs.

The filter (`RunFilter`): statuses, agent, creator (a username) and a run id, whole or its first
hex digits. A prefix is read as the range of ids it begins, so the primary key's index answers it
(`id::text LIKE` would read every run of the workspace). Creator and agent have indexes led by the
workspace (run_ws_creator_recent, run_ws_agent_recent) whose order is the page's.

A cursor is the last row's (created_at, id), signed with the filter it pages: a cursor that this
server did not give for this filter (crafted, edited, or carried to another filter) is refused as
`invalid_cursor`, never read as a position.

The console's rows also carry a duration and two badges read in one query over a small partial
index of the trace (trace_run_decisions): calls denied (by a person or a rule) and whether a person
decided something in the run (approved, denied or answered).
"""

from __future__ import annotations

import hmac
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Q, QuerySet
from django.utils import timezone
from django.utils.crypto import salted_hmac
from django.utils.dateparse import parse_datetime

from oz0agents.models import Agent
from runs.kernel import InvalidRequest
from runs.models import Run, RunStatus, TraceEvent
from runs.permissions import can_read_content
from runs.selectors import encode_cursor, invalid_cursor, keyset_position, run_summary, uuid_or_invalid_cursor
from tenancy.models import Membership, Workspace

STATUSES = tuple(RunStatus.values)
TEXT_MAX = 150
HEX = re.compile(r"[0-9a-f]{1,32}")
# A person's decisions in a run (the inbox's verbs): what makes a run "decided by a person".
DECISION_VERBS = ("approve", "deny", "answer")
CURSOR_SIGNATURE = 22


@dataclass(frozen=True)
class RunFilter:
    statuses: tuple[str, ...] = ()
    agent: str | None = None
    creator: str | None = None
    run: str | None = None  # 1 to 32 lowercase hex digits, dashes taken out

    def as_query(self) -> dict[str, str]:
        """The filter as the runs list's query string (a saved filter stores this)."""
        query = {"status": ",".join(self.statuses), "agent": self.agent, "creator": self.creator, "run": self.run}
        return {name: value for name, value in query.items() if value}

    def key(self) -> str:
        return "|".join(f"{name}={value}" for name, value in sorted(self.as_query().items()))


def parse_run_filter(query: Mapping[str, Any]) -> RunFilter:
    """The filter from a query string (or a saved filter); anything malformed is a typed 400."""
    statuses: tuple[str, ...] = ()
    status = _text(query, "status")
    if status:
        statuses = tuple(dict.fromkeys(part.strip() for part in status.split(",") if part.strip()))
        if not statuses or any(part not in STATUSES for part in statuses):
            raise InvalidRequest("invalid_status", f"status must be one or more of {', '.join(STATUSES)}, comma separated")
    run = _text(query, "run")
    if run is not None:
        run = run.replace("-", "").lower()
        if not HEX.fullmatch(run):
            raise InvalidRequest("invalid_run", "run must be a run id or its first hex digits")
    return RunFilter(statuses=statuses, agent=_text(query, "agent"), creator=_text(query, "creator"), run=run)


def _text(query: Mapping[str, Any], name: str) -> str | None:
    value = query.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str) or len(value) > TEXT_MAX or "\x00" in value:
        raise InvalidRequest(f"invalid_{name}", f"{name} must be text of at most {TEXT_MAX} characters")
    return value.strip()


def filtered_runs(workspace: Workspace, run_filter: RunFilter) -> QuerySet[Run]:
    runs = Run.objects.filter(workspace=workspace)
    if run_filter.statuses:
        runs = runs.filter(status__in=run_filter.statuses)
    if run_filter.agent:
        runs = runs.filter(agent_name=run_filter.agent)
    if run_filter.creator:
        creator = get_user_model().objects.filter(username=run_filter.creator).values_list("pk", flat=True).first()
        runs = runs.filter(created_by_id=creator) if creator is not None else runs.none()
    if run_filter.run:
        low, high = id_range(run_filter.run)
        runs = runs.filter(pk=low) if low == high else runs.filter(pk__gte=low, pk__lte=high)
    return runs


def id_range(prefix: str) -> tuple[uuid.UUID, uuid.UUID]:
    """The ids a hex prefix begins: uuids order as their bytes, so a prefix is a range of the key."""
    return uuid.UUID(prefix.ljust(32, "0")), uuid.UUID(prefix.ljust(32, "f"))


def sign_cursor(payload: str, run_filter: RunFilter) -> str:
    digest = salted_hmac("oz0.runs.cursor", f"{run_filter.key()}\n{payload}", algorithm="sha256").hexdigest()
    return f"{payload}.{digest[:CURSOR_SIGNATURE]}"


def cursor_position(cursor: str | None, run_filter: RunFilter) -> tuple[Any, uuid.UUID] | None:
    if not cursor:
        return None
    if len(cursor) > 400 or "." not in cursor:
        raise invalid_cursor()
    payload = cursor.rsplit(".", 1)[0]
    if not hmac.compare_digest(sign_cursor(payload, run_filter), cursor):
        raise invalid_cursor()
    position = keyset_position(payload)
    assert position is not None  # a signed payload is one this server encoded
    return position[0], uuid_or_invalid_cursor(position[1])


def runs_page(
    user: Any,
    workspace: Workspace,
    run_filter: RunFilter,
    *,
    cursor: str | None = None,
    limit: int = 50,
    count_cap: int | None = None,
) -> dict[str, Any]:
    """One page of the filtered runs, newest first, with the count of all that match: exact, or
    with `count_cap`, counted no further than the cap (`count_capped` says it stopped there), and
    not at all on a later page (count_cap=0: "Load more" shows no count)."""
    position = cursor_position(cursor, run_filter)
    runs = filtered_runs(workspace, run_filter)
    if count_cap is None:
        count, capped = runs.count(), False
    elif count_cap == 0:
        count, capped = 0, False
    else:
        # Counting a workspace's every run is a read of them all; past the cap the number says little.
        count = runs.order_by()[: count_cap + 1].count()
        capped = count > count_cap
        count = min(count, count_cap)
    if position is not None:
        created, last_id = position
        runs = runs.filter(Q(created_at__lt=created) | Q(created_at=created, id__lt=last_id))
    page = list(runs.select_related("workspace", "agent_version").order_by("-created_at", "-id")[: limit + 1])
    more = len(page) > limit
    page = page[:limit]
    items = [run_summary(run, can_read_content(user, run)) for run in page]
    next_cursor = None
    if more and page:
        next_cursor = sign_cursor(encode_cursor([page[-1].created_at.isoformat(), str(page[-1].id)]), run_filter)
    return {"count": count, "count_capped": capped, "items": items, "next": next_cursor}


COUNT_CAP = 10_000


def list_rows(
    user: Any, workspace: Workspace, run_filter: RunFilter, *, cursor: str | None = None, limit: int = 50
) -> dict[str, Any]:
    """The console's page: each row with its creator, its duration and its badges; the count is
    capped, and a later page ("Load more", with a cursor) counts nothing."""
    page = runs_page(user, workspace, run_filter, cursor=cursor, limit=limit, count_cap=0 if cursor else COUNT_CAP)
    ids = [item["id"] for item in page["items"]]
    badges = decision_badges(ids)
    creators = dict(Run.objects.filter(pk__in=ids).values_list("pk", "created_by__username"))
    now = timezone.now()
    for item in page["items"]:
        run_id = uuid.UUID(item["id"])
        item["creator"] = creators.get(run_id)
        item["denied"], item["decided"] = badges.get(run_id, (0, False))
        item["duration_seconds"] = duration_seconds(item, now)
    return page


def duration_seconds(item: Mapping[str, Any], now: Any) -> int:
    """From creation to the end, or until now for a run not finished."""
    start = parse_datetime(item["created_at"])
    end = parse_datetime(item["finished_at"]) if item["finished_at"] else now
    return max(0, int((end - start).total_seconds())) if start and end else 0


def decision_badges(run_ids: list[Any]) -> dict[uuid.UUID, tuple[int, bool]]:
    """Per run: how many calls were denied (by a person or a rule) and whether a person decided
    anything (approved, denied, answered). One query over the trace's partial index."""
    if not run_ids:
        return {}
    rows = (
        TraceEvent.objects.filter(run_id__in=run_ids, event__in=("verb", "approval_denied"))
        .values_list("run_id", "event", "data__verb")
        .order_by()
    )
    badges: dict[uuid.UUID, tuple[int, bool]] = {}
    for run_id, event, verb in rows:
        denied, decided = badges.get(run_id, (0, False))
        if event == "approval_denied" or verb == "deny":
            denied += 1
        badges[run_id] = (denied, decided or verb in DECISION_VERBS)
    return badges


def suggestions(workspace: Workspace) -> dict[str, list[str]]:
    """The search's suggestions: the workspace's agents and its members (never a scan of its runs)."""
    agents = Agent.objects.filter(workspace=workspace).order_by("name").values_list("name", flat=True)[:200]
    members = Membership.objects.filter(workspace=workspace).order_by("user__username").values_list("user__username", flat=True)
    return {"agents": list(agents), "creators": list(members[:200])}
