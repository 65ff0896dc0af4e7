"""`GET /api/v1/workspaces/{ws}/audit`: the workspace's audit trail (runs/audit.py), newest first."""

from __future__ import annotations

from typing import Any, Literal
from uuid import UUID

from django.http import HttpRequest
from ninja import Query, Router, Schema

from oz0site.auth import person_auth
from runs import audit, selectors
from runs.schemas import ErrorOut, Moment, Page, moment_text

router = Router(tags=["audit"])


class AuditEntry(Schema):
    id: int
    at: str
    actor: str
    verb: str
    run: str
    task: str | None = None
    agent: str | None = None
    outcome: str | None = None
    tasks: list[str] | None = None
    content_visible: bool
    reason: str | None = None
    answer: Any = None
    has_answer: bool
    # An approval of arguments the approver edited (issue 30): for everyone; the original and the
    # edited arguments only for those who may read the run's words (F11, F12), null for the rest.
    edited: bool = False
    original_args: Any = None
    args: Any = None
    # Words of the platform's own (never the run's): whose a call became (`assign`), who was
    # reminded or told (`remind`, `escalate`), an approval's place among two.
    note: str | None = None


AuditPage = Page[AuditEntry]


@router.get(
    "/workspaces/{ws}/audit",
    auth=person_auth("viewer", where="ws", rate="read"),
    response={200: AuditPage, 400: ErrorOut, 401: ErrorOut, 404: ErrorOut},
    summary="Who did what to which run, when and why",
)
def audit_trail(
    request: HttpRequest,
    ws: str,
    actor: str | None = Query(None, min_length=1, max_length=150),
    verb: Literal[audit.VERBS] | None = None,  # type: ignore[valid-type]
    run: UUID | None = None,
    since: Moment | None = None,
    until: Moment | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> dict[str, Any]:
    workspace = selectors.workspace_for(request.user, ws)
    filters = audit.parse_filters(
        actor=actor, verb=verb, run=str(run) if run else None, since=moment_text(since), until=moment_text(until)
    )
    return audit.audit_page(request.user, workspace, filters, cursor=cursor, limit=max(1, min(limit, audit.MAX_LIMIT)))
