"""Bulk repair in the JSON API: POST /workspaces/{ws}/holds/retry and /holds/abandon.

The body is a filter (agent, version, kind, error_key, min_age_seconds, mine, runs, all) plus `dry_run`;
runs/holds.py selects the runs and runs/repair.py repairs them, one
transaction per run, so the API and the Holds page act the same. At most BULK_CAP runs per
request; `more: true` says the filter matched more.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router, Schema

from oz0site.auth import person_auth
from runs import failures, kernel, selectors
from runs.api import ERRORS, body_fields
from runs.holds import AGE_MAX_SECONDS, BULK_CAP, TEXT_MAX, parse_hold_filter
from runs.kernel import InvalidRequest
from runs.repair import bulk_repair

router = Router(tags=["holds"])


class BulkRunResult(Schema):
    """One run's outcome: retried, abandoned, abandoned and canceled, or skipped (with the reason's key and words)."""

    run: str
    task_keys: list[str]
    outcome: str
    reason: str | None = None
    detail: str | None = None


class BulkPreviewRun(Schema):
    """A run a repair would act on: its tasks and their kinds (never their failure's words)."""

    run: str
    agent: str | None = None
    version: int | None = None
    task_keys: list[str]
    kinds: list[str]
    waited_seconds: int
    # An abandon of these tasks alone leaves the run held: its deliverable needs them.
    strands_deliverable: bool = False
    # Whose run it is: its creator's username, whether it is private, and whether it is the caller's.
    creator: str | None = None
    private: bool = False
    mine: bool = False


class BulkRepairOut(Schema):
    """A preview (`dry_run`: `runs`, `count` of them) or a repair (`results`, `count` repaired, `skipped`)."""

    verb: str
    dry_run: bool
    cap: int
    more: bool
    count: int
    skipped: int | None = None
    # A preview's: how many of its runs are other people's, how many private, and how many both.
    others: int | None = None
    private: int | None = None
    others_private: int | None = None
    runs: list[BulkPreviewRun] | None = None
    results: list[BulkRunResult] | None = None


# Each field may be null, which is the same as leaving it out.
_TEXT = {"type": ["string", "null"], "maxLength": TEXT_MAX, "pattern": r"\S"}
# The body is read by runs.holds.parse_hold_filter (typed 400s per field); this documents it:
# at least one filter, or `all: true`.
FILTER_BODY = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "agent": _TEXT,
                    "error_key": _TEXT,
                    "kind": {
                        **_TEXT,
                        "description": "a platform failure kind, or one an agent of the workspace declares",
                        "enum": [*sorted(failures.PLATFORM_KINDS), None],
                    },
                    "version": {"type": ["integer", "null"], "minimum": 1, "maximum": 2**31 - 1},
                    "min_age_seconds": {"type": ["integer", "null"], "minimum": 0, "maximum": AGE_MAX_SECONDS},
                    "runs": {
                        "type": ["array", "null"],
                        "minItems": 1,
                        "maxItems": BULK_CAP,
                        "items": {"type": "string", "format": "uuid"},
                    },
                    "mine": {"type": ["boolean", "null"], "description": "only the runs the caller created"},
                    "all": {"type": "boolean"},
                    "dry_run": {"type": "boolean", "default": False},
                },
                "anyOf": [
                    *(
                        {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
                        for name in ("agent", "error_key", "kind", "version", "min_age_seconds", "runs")
                    ),
                    {"required": ["all"], "properties": {"all": {"const": True}}},
                    {"required": ["mine"], "properties": {"mine": {"const": True}}},
                ],
            }
        }
    },
}


def _bulk(request: HttpRequest, ws: str, verb: str) -> dict[str, Any]:
    workspace = selectors.workspace_for(request.user, ws)
    # Standing before the body is read: a viewer's malformed filter still answers 403.
    kernel.require_write(request.user, workspace.pk)
    body = dict(body_fields(request))
    dry_run = body.pop("dry_run", False)
    if not isinstance(dry_run, bool):
        raise InvalidRequest("invalid_filter", "dry_run must be true or false")
    return bulk_repair(workspace, request.user, verb, parse_hold_filter(body, workspace, request.user), dry_run=dry_run)


@router.post(
    "/workspaces/{ws}/holds/retry",
    auth=person_auth("operator", where="ws", rate="write"),
    response={200: BulkRepairOut, **ERRORS},
    summary="Retry many held runs (S14)",
    openapi_extra={"requestBody": FILTER_BODY},
    exclude_none=True,
)
def retry_holds(request: HttpRequest, ws: str) -> dict[str, Any]:
    return _bulk(request, ws, "retry")


@router.post(
    "/workspaces/{ws}/holds/abandon",
    auth=person_auth("operator", where="ws", rate="write"),
    response={200: BulkRepairOut, **ERRORS},
    summary="Abandon many held runs (S14)",
    openapi_extra={"requestBody": FILTER_BODY},
    exclude_none=True,
)
def abandon_holds(request: HttpRequest, ws: str) -> dict[str, Any]:
    return _bulk(request, ws, "abandon")


@router.post(
    "/workspaces/{ws}/holds/abandon_and_cancel",
    auth=person_auth("operator", where="ws", rate="write"),
    response={200: BulkRepairOut, **ERRORS},
    summary="Abandon many held runs' failures and cancel each run (S14)",
    openapi_extra={"requestBody": FILTER_BODY},
    exclude_none=True,
)
def abandon_and_cancel_holds(request: HttpRequest, ws: str) -> dict[str, Any]:
    return _bulk(request, ws, "abandon_and_cancel")
