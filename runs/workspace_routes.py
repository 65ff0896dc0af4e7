"""How a workspace's managed collections are routed in the API (walls, approver groups, wait
deadlines, schedules, triggers): every member of the workspace `{ws}` reads them, its operators
change them, and a refusal is the kernel's typed error (`ERRORS`). One place says so, so that a
new collection cannot give a write to a reader or answer an untyped error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ninja import Router

from oz0site.auth import person_auth
from runs.api import ERRORS


def member_read(router: Router, path: str, response: Any, *, summary: str) -> Callable[[Any], Any]:
    """A GET any member may make (viewers up), at the read rate."""
    return router.get(
        path, auth=person_auth("viewer", where="ws", rate="read"), response={200: response, **ERRORS}, summary=summary
    )


def operator_write(
    router: Router,
    method: str,
    path: str,
    response: Any,
    *,
    summary: str,
    status: int = 200,
    body: dict[str, Any] | None = None,
) -> Callable[[Any], Any]:
    """A change only the workspace's operators make, at the write rate; `body` documents the JSON
    body (`settings_input.request_body`), `status` is the success's (201 made, 204 gone)."""
    return router.api_operation(
        [method],
        path,
        auth=person_auth("operator", where="ws", rate="write"),
        response={status: response, **ERRORS},
        openapi_extra=body,
        summary=summary,
    )
