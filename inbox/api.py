from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router, Schema
from pydantic import ConfigDict

from inbox import selectors
from runs.kernel.errors import InvalidRequest
from runs.schemas import ErrorOut

router = Router(tags=["inbox"])


class InboxItem(Schema):
    model_config = ConfigDict(extra="allow")
    id: str
    kind: str
    run: str
    task: str | None = None
    agent: str | None = None
    since: str


class InboxPage(Schema):
    items: list[InboxItem]
    next: str | None = None


@router.get("/inbox", response={200: InboxPage, 400: ErrorOut, 401: ErrorOut}, summary="Everything waiting on a person")
def inbox(
    request: HttpRequest,
    workspace: str | None = None,
    kind: str | None = None,
    agent: str | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> dict[str, Any]:
    if kind is not None and kind not in selectors.KINDS:
        raise InvalidRequest("invalid_kind", f"kind must be one of {', '.join(selectors.KINDS)}")
    return selectors.inbox_items(
        request.user, workspace=workspace, kind=kind, agent=agent, cursor=cursor, limit=max(1, min(limit, 200))
    )
