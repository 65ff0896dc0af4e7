"""Saved runs-list filters: a person's own, per workspace (console.models.SavedRunFilter).

Saving a name again replaces that filter; at most MAX_PER_WORKSPACE per person and workspace.
Anything malformed is a typed InvalidRequest, another person's filter is NotFound.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.db import transaction

from console.models import SavedRunFilter
from runs.kernel import InvalidRequest, NotFound
from runs.run_list import RunFilter, parse_run_filter
from tenancy.models import Workspace

NAME_MAX = 80
MAX_PER_WORKSPACE = 30


def saved_filters(user: Any, workspace: Workspace) -> list[dict[str, Any]]:
    """The person's filters by name, each as the list's query string: read through the list's own
    parser (in its field order), so a stored row is never taken on trust."""
    rows = SavedRunFilter.objects.filter(user_id=user.pk, workspace=workspace).order_by("name")
    saved = []
    for row in rows:
        try:
            query = parse_run_filter(row.query if isinstance(row.query, dict) else {}).as_query()
        except InvalidRequest:
            query = {}
        saved.append({"id": row.pk, "name": row.name, "query": urlencode(query)})
    return saved


def filter_name(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > NAME_MAX or "\x00" in value:
        raise InvalidRequest("invalid_name", f"a saved filter needs a name of 1 to {NAME_MAX} characters")
    return " ".join(value.split())


def save_filter(user: Any, workspace: Workspace, name: Any, query: dict[str, Any]) -> SavedRunFilter:
    """Save (or replace) the filter `query` under `name`; an empty filter is nothing to save."""
    name = filter_name(name)
    run_filter: RunFilter = parse_run_filter(query)
    if not run_filter.as_query():
        raise InvalidRequest("empty_filter", "filter the list first (status, agent, creator or run), then save it")
    with transaction.atomic():
        mine = SavedRunFilter.objects.select_for_update().filter(user_id=user.pk, workspace=workspace)
        names = set(mine.values_list("name", flat=True))
        if name not in names and len(names) >= MAX_PER_WORKSPACE:
            raise InvalidRequest("too_many_filters", f"at most {MAX_PER_WORKSPACE} saved filters per workspace; delete one first")
        saved, _ = SavedRunFilter.objects.update_or_create(
            user_id=user.pk, workspace=workspace, name=name, defaults={"query": run_filter.as_query()}
        )
    return saved


def delete_filter(user: Any, workspace: Workspace, filter_id: int) -> None:
    if not 0 < filter_id < 2**63:
        raise NotFound("saved filter")
    deleted, _ = SavedRunFilter.objects.filter(pk=filter_id, user_id=user.pk, workspace=workspace).delete()
    if not deleted:
        raise NotFound("saved filter")
