from __future__ import annotations

from typing import Any, Literal

from django.http import HttpRequest
from ninja import Query, Router, Schema
from pydantic import ConfigDict

from inbox import selectors
from oz0site.auth import person_auth
from runs.kernel import InvalidRequest
from runs.schemas import SLUG_QUERY, TEXT_QUERY, ErrorOut, Page

router = Router(tags=["inbox"])


class InboxItem(Schema):
    model_config = ConfigDict(extra="allow")
    id: str
    kind: str
    run: str
    workspace: str | None = None
    task: str | None = None
    agent: str | None = None
    since: str
    waited_seconds: int | None = None
    deadline: str | None = None
    remaining_seconds: int | None = None
    tool: str | None = None
    content_visible: bool | None = None
    # Whether the caller may approve, deny or answer it: operator standing and the standing to read
    # its words (a private run's are its creator's); false, the decision answers 403 content_hidden.
    actionable: bool | None = None
    # Only for those who may read the run's words (F11, F12): left out, not null, for the others.
    args: Any = None
    question: str | None = None
    # The digest (SHA-256 of tool + args) an approval of exactly these args is bound to: send it back
    # with the approve, and a call that changed since is refused (409 approval_stale).
    digest: str | None = None
    reason: str | None = None
    blocked_task_keys: list[str] | None = None
    kinds: list[str] | None = None
    # A held child run's parent run, which waits on it (F14).
    parent: str | None = None


InboxPage = Page[InboxItem]


@router.get(
    "/inbox",
    auth=person_auth(rate="read"),
    response={200: InboxPage, 400: ErrorOut, 401: ErrorOut},
    exclude_unset=True,
    summary="Everything waiting on a person",
)
def inbox(
    request: HttpRequest,
    workspace: str | None = Query(None, **SLUG_QUERY),
    kind: Literal["approval", "question", "hold"] | None = None,
    agent: str | None = Query(None, **TEXT_QUERY),
    cursor: str | None = None,
    limit: int = 50,
) -> dict[str, Any]:
    if kind is not None and kind not in selectors.KINDS:
        raise InvalidRequest("invalid_kind", f"kind must be one of {', '.join(selectors.KINDS)}")
    return selectors.inbox_items(
        request.user, workspace=workspace, kind=kind, agent=agent, cursor=cursor, limit=max(1, min(limit, 200))
    )
