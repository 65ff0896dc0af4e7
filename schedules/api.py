"""/api/v1/workspaces/{ws}/schedules: list, create, read, change, pause, resume, delete; each
schedule's firings, and the workspace's schedule audit trail (schedule-events).

Viewers and readers read (a stored run body is content: readers see it, viewers get null);
operators manage. Bodies are read and checked by schedules/services.py (typed 400 keys); the
schemas here document them."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router, Status

from runs import selectors
from runs.api import ERRORS, body_of
from runs.schemas import ErrorOut, Out, Page
from runs.workspace_routes import member_read, operator_write
from schedules import services, triggers
from schedules.models import OUTCOMES, OVERLAPS

router = Router(tags=["schedules"])


class ScheduleOut(Out):
    id: int
    name: str
    owner: str | None = None
    agent: str | None = None
    # The stored run-create body: null for viewers (it is content), and for others' private runs.
    run: dict[str, Any] | None = None
    cron: str | None = None
    timezone: str
    interval_seconds: int | None = None
    overlap: str
    catch_up: int
    paused: bool
    # The next due times (UTC, RFC 3339); empty while paused.
    next_fire_times: list[str]
    last_run: str | None = None
    queued: bool
    created_at: str
    updated_at: str


class FiringOut(Out):
    id: int
    due_at: str
    fired_at: str
    run: str | None = None
    # started, skipped, queued, canceled_previous, missed, refused (with the kernel's error key)
    outcome: str
    error_key: str | None = None
    detail: str | None = None


class ScheduleEventOut(Out):
    id: int
    at: str
    actor: str
    verb: str
    schedule: int | None = None
    # The name of the schedule, or of the trigger when `subject` is "trigger".
    schedule_name: str
    subject: str
    changes: dict[str, Any]


TIMING = {
    "cron": {"type": "string", "maxLength": 200, "description": "five fields, or @hourly, @daily, ..."},
    "timezone": {"type": "string", "maxLength": 64, "default": "UTC", "description": "an IANA zone the cron is read in"},
    "interval_seconds": {"type": "integer", "minimum": 60, "maximum": 366 * 24 * 3600},
}
FIELDS = {
    "name": {"type": "string", "pattern": r"^[-a-zA-Z0-9_]{1,64}$"},
    "run": {"type": "object", "description": "a run-create body (POST /workspaces/{ws}/runs), compiled when saved"},
    **TIMING,
    "overlap": {"type": "string", "enum": list(OVERLAPS), "default": "skip"},
    "catch_up": {"type": "integer", "minimum": 1, "maximum": services.CATCH_UP_MAX, "default": 1},
}


def _body_schema(required: list[str], extra: dict[str, Any], **more: Any) -> dict[str, Any]:
    schema = {"type": "object", "additionalProperties": False, "required": required, "properties": {**FIELDS, **extra}, **more}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


CREATE_BODY = _body_schema(["name", "run"], {"paused": {"type": "boolean", "default": False}})
CHANGE_BODY = _body_schema([], {}, minProperties=1)


@member_read(
    router,
    "/workspaces/{ws}/schedules",
    Page[ScheduleOut],
    summary="The workspace's schedules and their next fire times (one page)",
)
def list_schedules(request: HttpRequest, ws: str) -> dict[str, Any]:
    workspace = selectors.workspace_for(request.user, ws)
    return {"items": [services.document(request.user, s) for s in services.schedules_of(workspace)], "next": None}


@operator_write(
    router,
    "POST",
    "/workspaces/{ws}/schedules",
    ScheduleOut,
    status=201,
    body=CREATE_BODY,
    summary="Create a schedule: a run-create body started on a cron or an interval",
)
def create_schedule(request: HttpRequest, ws: str) -> Status[dict[str, Any]]:
    workspace = selectors.workspace_for(request.user, ws)
    schedule = services.create(workspace=workspace, user=request.user, body=body_of(request))
    return Status(201, services.document(request.user, schedule))


@member_read(router, "/workspaces/{ws}/schedules/{schedule_id}", ScheduleOut, summary="One schedule")
def read_schedule(request: HttpRequest, ws: str, schedule_id: int) -> dict[str, Any]:
    workspace = selectors.workspace_for(request.user, ws)
    return services.document(request.user, services.schedule_for(request.user, workspace, schedule_id))


@operator_write(
    router,
    "PATCH",
    "/workspaces/{ws}/schedules/{schedule_id}",
    ScheduleOut,
    body=CHANGE_BODY,
    summary="Change a schedule (a new timing counts from now)",
)
def change_schedule(request: HttpRequest, ws: str, schedule_id: int) -> dict[str, Any]:
    workspace = selectors.workspace_for(request.user, ws)
    schedule = services.change(workspace=workspace, user=request.user, schedule_id=schedule_id, body=body_of(request))
    return services.document(request.user, schedule)


@operator_write(router, "POST", "/workspaces/{ws}/schedules/{schedule_id}/pause", ScheduleOut, summary="Pause a schedule")
def pause_schedule(request: HttpRequest, ws: str, schedule_id: int) -> dict[str, Any]:
    workspace = selectors.workspace_for(request.user, ws)
    return services.document(request.user, services.pause(workspace=workspace, user=request.user, schedule_id=schedule_id))


@operator_write(
    router,
    "POST",
    "/workspaces/{ws}/schedules/{schedule_id}/resume",
    ScheduleOut,
    summary="Resume a schedule (times passed while paused are not caught up)",
)
def resume_schedule(request: HttpRequest, ws: str, schedule_id: int) -> dict[str, Any]:
    workspace = selectors.workspace_for(request.user, ws)
    return services.document(request.user, services.resume(workspace=workspace, user=request.user, schedule_id=schedule_id))


@operator_write(
    router,
    "DELETE",
    "/workspaces/{ws}/schedules/{schedule_id}",
    None,
    status=204,
    summary="Delete a schedule (its audit rows stay)",
)
def delete_schedule(request: HttpRequest, ws: str, schedule_id: int) -> Status[None]:
    workspace = selectors.workspace_for(request.user, ws)
    services.delete(workspace=workspace, user=request.user, schedule_id=schedule_id)
    return Status(204, None)


@member_read(
    router,
    "/workspaces/{ws}/schedules/{schedule_id}/firings",
    Page[FiringOut],
    summary=f"A schedule's firings, newest first ({', '.join(OUTCOMES)})",
)
def schedule_firings(request: HttpRequest, ws: str, schedule_id: int, cursor: str | None = None) -> dict[str, Any]:
    workspace = selectors.workspace_for(request.user, ws)
    return services.firings_page(services.schedule_for(request.user, workspace, schedule_id), cursor)


@member_read(
    router,
    "/workspaces/{ws}/schedule-events",
    Page[ScheduleEventOut],
    summary="Who created, changed, paused, resumed or deleted the workspace's schedules and triggers, newest first",
)
def schedule_events(request: HttpRequest, ws: str, cursor: str | None = None) -> dict[str, Any]:
    workspace = selectors.workspace_for(request.user, ws)
    return services.events_page(workspace, cursor)


# --- signed triggers (schedules/triggers.py) ---


class TriggerOut(Out):
    id: int
    name: str
    # Where the outside system posts, signed: X-Oz0-Signature: sha256=<hex HMAC-SHA256 of the body>.
    url: str
    owner: str | None = None
    agent: str | None = None
    input_template: dict[str, Any]
    idempotency: dict[str, str]
    signature_header: str
    created_at: str


class TriggerCreated(TriggerOut):
    # In this answer only: it is never stored and never shown again.
    secret: str


class DeliveryOut(Out):
    run: str | None = None
    # True: a delivery with this idempotency key was accepted before; nothing new was started.
    replayed: bool


TRIGGER_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name", "run", "idempotency"],
                    "properties": {
                        "name": FIELDS["name"],
                        "run": {"type": "object", "description": "a run-create body without `input`"},
                        "input_template": {
                            "type": "object",
                            "maxProperties": triggers.TEMPLATE_MAX,
                            "additionalProperties": {
                                "oneOf": [
                                    {
                                        "type": "string",
                                        "pattern": "^(/.*)?$",
                                        "maxLength": triggers.POINTER_MAX,
                                        "description": "a JSON pointer into the posted body",
                                    },
                                    {
                                        "type": "object",
                                        "required": ["const"],
                                        "additionalProperties": False,
                                        "properties": {"const": {}},
                                    },
                                ]
                            },
                        },
                        "idempotency": {
                            "oneOf": [
                                {
                                    "type": "object",
                                    "required": ["header"],
                                    "additionalProperties": False,
                                    "properties": {"header": {"type": "string", "pattern": "^[A-Za-z0-9][-A-Za-z0-9]{0,63}$"}},
                                },
                                {
                                    "type": "object",
                                    "required": ["field"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "field": {"type": "string", "pattern": "^(/.*)?$", "maxLength": triggers.POINTER_MAX}
                                    },
                                },
                            ]
                        },
                    },
                }
            }
        },
    }
}


@member_read(
    router, "/workspaces/{ws}/triggers", Page[TriggerOut], summary="The workspace's signed triggers (never their secrets)"
)
def list_triggers(request: HttpRequest, ws: str) -> dict[str, Any]:
    workspace = selectors.workspace_for(request.user, ws)
    return {"items": [triggers.document(t) for t in triggers.triggers_of(workspace)], "next": None}


@operator_write(
    router,
    "POST",
    "/workspaces/{ws}/triggers",
    TriggerCreated,
    status=201,
    body=TRIGGER_BODY,
    summary="Create a signed trigger (its secret is shown once, in this answer)",
)
def create_trigger(request: HttpRequest, ws: str) -> Status[dict[str, Any]]:
    workspace = selectors.workspace_for(request.user, ws)
    trigger, secret = triggers.create(workspace=workspace, user=request.user, body=body_of(request))
    response = triggers.document(trigger, secret=secret)
    return Status(201, response)


@operator_write(router, "DELETE", "/workspaces/{ws}/triggers/{trigger_id}", None, status=204, summary="Delete a signed trigger")
def delete_trigger(request: HttpRequest, ws: str, trigger_id: int) -> Status[None]:
    workspace = selectors.workspace_for(request.user, ws)
    triggers.delete(workspace=workspace, user=request.user, trigger_id=trigger_id)
    return Status(204, None)


@router.post(
    "/triggers/{public_id}",
    auth=None,
    response={200: DeliveryOut, 201: DeliveryOut, 401: ErrorOut, **ERRORS},
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {}}}}},
    summary="A signed delivery from an outside system: starts one run per idempotency key",
)
def deliver_trigger(request: HttpRequest, public_id: str) -> Status[dict[str, Any]]:
    return triggers.deliver(request, public_id)
