"""The test tools' part of the JSON API (API.md): how often a test effect ran."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest
from ninja import Query, Router

from runs import selectors
from runs.kernel import NotFound
from runs.schemas import SLUG_QUERY, ErrorOut, Out
from testtools.models import EffectRecord

router = Router(tags=["test tools"])

ERRORS: dict[int, Any] = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut}


class EffectCount(Out):
    id: str
    count: int


@router.get("/test/effects/{effect_id}", response={200: EffectCount, **ERRORS}, summary="How often a test effect ran")
def effect_count(request: HttpRequest, effect_id: str, workspace: str | None = Query(None, **SLUG_QUERY)) -> dict[str, Any]:
    """Counts the executions of runs in the caller's workspaces (or in the one named) only."""
    if not settings.OZ0_TEST_TOOLS:
        raise NotFound("test tool ledger")
    if workspace is not None:
        workspace_ids = [selectors.workspace_for(request.user, workspace).pk]
    else:
        workspace_ids = list(selectors.workspaces_of(request.user).values_list("workspace_id", flat=True))
    count = EffectRecord.objects.filter(effect_id=effect_id, workspace_id__in=workspace_ids).count()
    return {"id": effect_id, "count": count}
