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
    # An approval's context (issue 30): the run's agent version; whether the tool may run again blind
    # (false: the call has effects); a framework's own tool; the words the model said beside the
    # call (content readers only, left out for the others; null when it said none); how many
    # pending calls the caller may approve share this digest (actionable items only; see identical_capped).
    agent_version: int | None = None
    replayable: bool | None = None
    native: bool | None = None
    model_message: str | None = None
    identical: int | None = None
    # True when `identical` counted only the oldest pending calls (a lower bound: a huge inbox).
    identical_capped: bool | None = None
    # When the words are hidden because the run is someone else's private run: its creator's
    # username (left out when the caller's role is why, or when they may read them).
    private_of: str | None = None
    # When the words are hidden by a wall around the run's agent (F11): that agent.
    walled: str | None = None
    reason: str | None = None
    # A hold's first blocked failure: its error key for everyone, its detail (the run's words)
    # only for content readers (F11, F12), and the failure kind the key maps to.
    error: dict[str, Any] | None = None
    failure_kind: str | None = None
    blocked_task_keys: list[str] | None = None
    kinds: list[str] | None = None
    # A held child run's parent run, which waits on it (F14).
    parent: str | None = None
    # Whose it is (issue 31): the approver groups whose tool patterns the call matches ("group
    # payments"), else ["operators"]; a group's members; whether it is the caller's to decide.
    owners: list[str] | None = None
    owner_members: list[str] | None = None
    yours: bool | None = None
    # An operator outside the groups that own the call: it is not theirs (actionable false).
    not_yours: bool | None = None
    # A call with effects that its group lets run only after two different approvers: who approved
    # it so far; `awaiting_second` for the one who gave the first approval.
    two_approvers: bool | None = None
    approved_by: list[str] | None = None
    awaiting_second: bool | None = None
    # Past the workspace's reminder time "due", past its escalation time "overdue" (else null), and
    # when each comes (null: that stage is off).
    due: Literal["due", "overdue"] | None = None
    due_at: str | None = None
    overdue_at: str | None = None


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
    kind: Literal["approval", "question", "client_await", "hold"] | None = None,
    agent: str | None = Query(None, **TEXT_QUERY),
    cursor: str | None = None,
    limit: int = 50,
) -> dict[str, Any]:
    if kind is not None and kind not in selectors.KINDS:
        raise InvalidRequest("invalid_kind", f"kind must be one of {', '.join(selectors.KINDS)}")
    return selectors.inbox_items(
        request.user, workspace=workspace, kind=kind, agent=agent, cursor=cursor, limit=max(1, min(limit, 200))
    )
