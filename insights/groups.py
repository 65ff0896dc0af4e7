"""Failure groups, as Sentry groups errors: reads and the one write (marking a group resolved).

A group is one workspace's failures of the same kind, agent, error key and message shape
(runs.fingerprints); the trigger of `0008_failure_group_triggers` counts it as the kernel
writes findings. A group holds no words: its shape is read from one of its example runs,
and shown only to someone who may read that run's words (F11, F12); everyone else sees the
kind, the error key and the counts.
"""

from __future__ import annotations

from datetime import date
from typing import Any

from django.db.models import Q
from django.utils import timezone

from insights.models import FailureGroup, FailureGroupVersion
from runs.fingerprints import message_shape
from runs.kernel import Forbidden, InvalidRequest, NotFound
from runs.models import Finding, Run
from runs.permissions import content_readable
from runs.selectors import encode_cursor, invalid_cursor, keyset_position
from tenancy.models import Membership
from tenancy.permissions import has_write_standing

TOP_GROUPS = 5
EXAMPLES = 5
PAGE_MAX = 200
VERSION_MAX = 2**31 - 1

Statement = tuple[str, str, list[Any]]
GROUP_COLUMNS = (
    "g.id, g.kind, g.error_key, {failed}, g.first_seen, g.last_seen, g.first_version, g.last_version, g.resolved_in_version"
)


def top_groups_statement(
    agent: str,
    version: int | None,
    since: date | None,
    until: date | None,
    *,
    workspace_ids: list[int] | None,
    limit: int = TOP_GROUPS,
) -> Statement:
    """An agent's commonest groups (in that version, if one is given) seen within the window:
    the scorecard runs it beside its rollup reads, so the benchmark times it too."""
    # One version reads its own counts (and seen times) from its per-version rows, by their index.
    table = "g" if version is None else "v"
    clauses = [f"{table}.agent_name = %s"]
    params: list[Any] = [agent]
    if version is not None:
        clauses.append("v.agent_version = %s")
        params.append(version)
    if workspace_ids is not None:
        clauses.append(f"{table}.workspace_id = ANY(%s)")
        params.append(list(workspace_ids))
    if since is not None:
        clauses.append(f"{table}.last_seen >= %s")
        params.append(since)
    if until is not None:
        # The day after in PostgreSQL: Python's dates end at 9999-12-31, a window's may too.
        clauses.append(f"{table}.first_seen < %s::date + 1")
        params.append(until)
    where = " AND ".join(clauses)
    if version is None:
        sql = (
            f"SELECT {GROUP_COLUMNS.format(failed='g.failed')} FROM insights_failuregroup g "
            f"WHERE {where} ORDER BY g.failed DESC, g.id DESC LIMIT %s"
        )
    else:
        sql = (
            f"SELECT {GROUP_COLUMNS.format(failed='v.failed')} FROM insights_failuregroupversion v "
            "JOIN insights_failuregroup g ON g.workspace_id = v.workspace_id AND g.fingerprint = v.fingerprint "
            f"WHERE {where} ORDER BY v.failed DESC, g.id DESC LIMIT %s"
        )
    return ("top_groups", sql, [*params, limit])


def group_rows(rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """The scorecard's top groups from `top_groups_statement`'s rows: ids, kinds and counts, no words."""
    return [
        {
            "id": pk,
            "kind": kind,
            "error_key": error_key or None,
            "failed": int(failed),
            "first_seen": first_seen.isoformat(),
            "last_seen": last_seen.isoformat(),
            "versions": [first_version or None, last_version or None],
            "resolved_in_version": resolved,
            "regressed": resolved is not None and last_version > resolved,
        }
        for pk, kind, error_key, failed, first_seen, last_seen, first_version, last_version, resolved in rows
    ]


def group_for(user: Any, group_id: int) -> FailureGroup:
    """A group of a workspace the user is a member of (any role); anything else is 404."""
    group = FailureGroup.objects.filter(pk=group_id).first() if 0 < group_id < 2**63 else None
    if group is None or not Membership.objects.filter(user_id=user.pk, workspace_id=group.workspace_id).exists():
        raise NotFound("group")
    return group


def group_summary(group: FailureGroup, slug: str | None) -> dict[str, Any]:
    return {
        "id": group.pk,
        "workspace": slug,
        "agent": group.agent_name or None,
        "kind": group.kind,
        "error_key": group.error_key or None,
        "failed": group.failed,
        "runs": group.failed,  # a run is counted once, by its first finding
        "first_seen": group.first_seen.isoformat(),
        "last_seen": group.last_seen.isoformat(),
        "first_version": group.first_version or None,
        "last_version": group.last_version or None,
        "resolved_in_version": group.resolved_in_version,
        "resolved_at": group.resolved_at.isoformat() if group.resolved_at else None,
        "regressed": group.regressed,
    }


def group_detail(user: Any, group_id: int) -> dict[str, Any]:
    """A group with the versions it affects, its newest example runs and — for someone who may
    read one of them — its message shape, masked from the newest run whose words they may read."""
    group = group_for(user, group_id)
    slug = Membership.objects.filter(user_id=user.pk, workspace_id=group.workspace_id).values_list("workspace__slug", flat=True)
    versions = FailureGroupVersion.objects.filter(workspace_id=group.workspace_id, fingerprint=group.fingerprint)
    findings = Finding.objects.filter(workspace_id=group.workspace_id, fingerprint=group.fingerprint).order_by(
        "-created_at", "-pk"
    )
    examples = list(findings.values("run_id", "agent_version", "created_at")[:EXAMPLES])
    readable = (
        Run.objects.filter(content_readable(user), workspace_id=group.workspace_id, id__in=findings.values("run_id")[:200])
        .order_by("-created_at")
        .values_list("failure__message", flat=True)
        .first()
    )
    return {
        **group_summary(group, slug.first()),
        "versions": [
            {
                "version": v.agent_version or None,
                "failed": v.failed,
                "first_seen": v.first_seen.isoformat(),
                "last_seen": v.last_seen.isoformat(),
            }
            for v in versions.order_by("-agent_version")
        ],
        "examples": [
            {"run": str(e["run_id"]), "version": e["agent_version"], "created_at": e["created_at"].isoformat()} for e in examples
        ],
        "shape": message_shape(readable) if isinstance(readable, str) and readable else None,
    }


def list_groups(
    user: Any,
    *,
    workspace_ids: dict[int, str],
    agent: str | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> dict[str, Any]:
    """A page of groups, the most recently seen first, keyset-paged by (last_seen, id)."""
    rows = FailureGroup.objects.filter(workspace_id__in=list(workspace_ids))
    if agent is not None:
        rows = rows.filter(agent_name=agent)
    position = keyset_position(cursor)
    if position is not None:
        after, last_pk = position
        if not isinstance(last_pk, int) or isinstance(last_pk, bool) or not 0 < last_pk < 2**63:
            raise invalid_cursor()
        rows = rows.filter(Q(last_seen__lt=after) | Q(last_seen=after, pk__lt=last_pk))
    limit = max(1, min(limit, PAGE_MAX))
    page = list(rows.order_by("-last_seen", "-pk")[: limit + 1])
    more = len(page) > limit
    page = page[:limit]
    return {
        "items": [group_summary(g, workspace_ids.get(g.workspace_id)) for g in page],
        "next": encode_cursor([page[-1].last_seen.isoformat(), page[-1].pk]) if more and page else None,
    }


def resolve(user: Any, group_id: int, version: int | None) -> dict[str, Any]:
    """Mark a group resolved in `version` of its agent (None: open it again). Needs write standing.
    A later version's finding then flags it as regressed (`FailureGroup.regressed`)."""
    group = group_for(user, group_id)
    if not has_write_standing(user, group.workspace_id):
        raise Forbidden()
    if version is not None and (isinstance(version, bool) or not 1 <= version <= VERSION_MAX):
        raise InvalidRequest("invalid_version", f"version must be a number from 1 to {VERSION_MAX}")
    # One UPDATE of the three columns only: the trigger's counts of the same row are left alone.
    FailureGroup.objects.filter(pk=group.pk).update(
        resolved_in_version=version,
        resolved_at=timezone.now() if version is not None else None,
        resolved_by_id=user.pk if version is not None else None,
    )
    return group_detail(user, group.pk)
