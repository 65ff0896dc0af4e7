"""What a workspace setting's body holds, checked alike for every managed collection: a JSON object
with known fields only (walls, approver groups, schedules, triggers), and usernames of the
workspace's members (walls, approver groups)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from django.contrib.auth import get_user_model

from runs.kernel import InvalidRequest
from tenancy.models import Membership, Workspace

USERNAME_MAX = 150


def body_fields(body: Any, *, allowed: Collection[str]) -> dict[str, Any]:
    """The body as a JSON object of the `allowed` fields only (`invalid_request`, `unknown_field`)."""
    if not isinstance(body, dict):
        raise InvalidRequest("invalid_request", "the body must be a JSON object")
    # Named shortened: a field's name is the caller's text, of any length.
    unknown = sorted(str(name)[:40] for name in body if name not in allowed)
    if unknown:
        raise InvalidRequest("unknown_field", f"unknown fields: {', '.join(unknown[:5])}")
    return body


def workspace_members(workspace: Workspace, names: Any, *, most: int, what: str) -> list[Any]:
    """The users `names` lists, each a member of the workspace (`not_a_member` names the others)."""
    if not isinstance(names, list) or not all(isinstance(name, str) and 0 < len(name) <= USERNAME_MAX for name in names):
        raise InvalidRequest("invalid_members", "`members` must be a list of usernames")
    wanted = list(dict.fromkeys(names))
    if len(wanted) > most:
        raise InvalidRequest("too_many_members", f"{what} names at most {most} members")
    users = {u.username: u for u in get_user_model().objects.filter(username__in=wanted)}
    members = set(Membership.objects.filter(workspace=workspace, user__in=users.values()).values_list("user_id", flat=True))
    strangers = [name for name in wanted if name not in users or users[name].pk not in members]
    if strangers:
        shown = ", ".join(repr(name) for name in strangers[:5])
        raise InvalidRequest("not_a_member", f"not members of this workspace: {shown}")
    return [users[name] for name in wanted]


def request_body(required: list[str], properties: dict[str, Any], *, optional: bool = False) -> dict[str, Any]:
    """A route's `openapi_extra` for a JSON object body of exactly these properties (`optional`: the
    body may be left out, as `{}`)."""
    schema = {"type": "object", "additionalProperties": False, "required": required, "properties": properties}
    return {"requestBody": {"required": not optional, "content": {"application/json": {"schema": schema}}}}
