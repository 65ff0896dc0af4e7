"""Every write of a schedule goes through here: create, change, pause, resume, delete, each with
its audit row in the same transaction. A run-create body is compiled by the kernel's own
`compile_create` when saved, so a schedule cannot store a body the kernel would refuse."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from runs import kernel, selectors
from runs.kernel import Conflict, InvalidRequest, NotFound, whole_number
from runs.settings_input import body_fields
from schedules import timing
from schedules.models import OVERLAPS, Firing, Schedule, ScheduleEvent
from tenancy.models import Role, Workspace
from tenancy.permissions import ROLE_RANK, role_of

PER_WORKSPACE_MAX = 200
CATCH_UP_MAX = 10
UPCOMING = 5
NAME = re.compile(r"[-a-zA-Z0-9_]{1,64}")
FIELDS = frozenset({"name", "run", "cron", "timezone", "interval_seconds", "overlap", "catch_up", "paused"})
TIMING_FIELDS = ("cron", "timezone", "interval_seconds")


def _name(value: Any) -> str:
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise InvalidRequest("invalid_name", "a schedule's name is 1 to 64 letters, digits, - or _")
    return value


def _run_body(value: Any, workspace: Workspace) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidRequest("invalid_run", "`run` is a run-create body (an object: agent, input, ...)")
    # The kernel's own compile: its refusal (unknown agent, bad task, ...) is the answer, typed.
    kernel.compile_create(value, workspace)
    return value


def _overlap(value: Any) -> str:
    if value not in OVERLAPS:
        raise InvalidRequest("invalid_overlap", f"overlap is one of {', '.join(OVERLAPS)}")
    return str(value)


def _catch_up(value: Any) -> int:
    number = whole_number(value)
    if number is None or not 1 <= number <= CATCH_UP_MAX:
        raise InvalidRequest("invalid_catch_up", f"catch_up is a whole number from 1 to {CATCH_UP_MAX}")
    return number


def _paused(value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest("invalid_field", "`paused` must be true or false")
    return value


def _timing(body: Mapping[str, Any], current: Schedule | None) -> dict[str, Any]:
    """The timing fields a body sets, checked together: exactly one of cron and interval."""
    cron = body.get("cron", current.cron if current else "")
    interval = body.get("interval_seconds", current.interval_seconds if current else None)
    if "cron" in body and body["cron"] is not None and "interval_seconds" not in body:
        interval = None
    if "interval_seconds" in body and body["interval_seconds"] is not None and "cron" not in body:
        cron = ""
    zone_name = body.get("timezone", current.timezone if current else "UTC")
    zone = timing.check_zone(zone_name)
    has_cron, has_interval = bool(cron), interval is not None
    if has_cron == has_interval:
        raise InvalidRequest("invalid_timing", "a schedule has either `cron` (with `timezone`) or `interval_seconds`")
    if has_cron:
        return {"cron": timing.check_cron(cron, zone), "timezone": str(zone_name), "interval_seconds": None}
    return {"cron": "", "timezone": str(zone_name), "interval_seconds": timing.check_interval(interval)}


def _body(value: Any) -> Mapping[str, Any]:
    return body_fields(value, allowed=FIELDS)


def _next_fire(schedule: Schedule, after: datetime) -> datetime:
    return timing.next_after(
        cron=schedule.cron,
        zone_name=schedule.timezone,
        interval_seconds=schedule.interval_seconds,
        anchor_at=schedule.anchor_at,
        after=after,
    )


def actor_name(user: Any) -> str:
    return str(getattr(user, "username", "") or "oz0")


def _event(schedule: Schedule, user: Any, verb: str, changes: dict[str, Any] | None = None) -> None:
    ScheduleEvent.objects.create(
        workspace_id=schedule.workspace_id,
        schedule=schedule if verb != "deleted" else None,
        schedule_name=schedule.name,
        actor=actor_name(user),
        verb=verb,
        changes=changes or {},
    )


def create(*, workspace: Workspace, user: Any, body: Any) -> Schedule:
    kernel.require_write(user, workspace.pk)
    body = _body(body)
    if "name" not in body or "run" not in body:
        raise InvalidRequest("missing_field", "a schedule needs `name` and `run`")
    now = timezone.now()
    schedule = Schedule(
        workspace=workspace,
        name=_name(body["name"]),
        owner=user,
        body=_run_body(body["run"], workspace),
        overlap=_overlap(body.get("overlap", "skip")),
        catch_up=_catch_up(body.get("catch_up", 1)),
        paused=_paused(body.get("paused", False)),
        anchor_at=now,
        **_timing(body, None),
    )
    schedule.next_fire_at = _next_fire(schedule, now)
    with transaction.atomic():
        # The workspace's row orders its creates, so two cannot both take the last place.
        Workspace.objects.select_for_update(no_key=True).filter(pk=workspace.pk).exists()
        if Schedule.objects.filter(workspace=workspace).count() >= PER_WORKSPACE_MAX:
            raise Conflict("too_many_schedules", f"a workspace holds at most {PER_WORKSPACE_MAX} schedules")
        try:
            with transaction.atomic():
                schedule.save()
        except IntegrityError:
            raise Conflict("name_taken", f"this workspace already has a schedule named {schedule.name!r}") from None
        _event(schedule, user, "created", _summary(schedule))
    return schedule


def _summary(schedule: Schedule) -> dict[str, Any]:
    return {
        "cron": schedule.cron or None,
        "timezone": schedule.timezone,
        "interval_seconds": schedule.interval_seconds,
        "overlap": schedule.overlap,
        "catch_up": schedule.catch_up,
        "agent": schedule.body.get("agent"),
        "paused": schedule.paused,
    }


def schedule_for(user: Any, workspace: Workspace, schedule_id: Any) -> Schedule:
    """A schedule of the workspace (the caller is a member: the selector checked); else 404."""
    try:
        pk = int(schedule_id)
        if not 0 < pk < 2**63:
            raise ValueError(pk)
        return Schedule.objects.select_related("owner").get(pk=pk, workspace=workspace)
    except (Schedule.DoesNotExist, ValueError, TypeError, OverflowError):
        raise NotFound("schedule") from None


def _locked(workspace: Workspace, user: Any, schedule_id: Any) -> Schedule:
    kernel.require_write(user, workspace.pk)
    schedule_for(user, workspace, schedule_id)
    return Schedule.objects.select_for_update().get(pk=int(schedule_id))


def change(*, workspace: Workspace, user: Any, schedule_id: Any, body: Any) -> Schedule:
    kernel.require_write(user, workspace.pk)
    schedule_for(user, workspace, schedule_id)  # a missing schedule is 404 whatever the body
    body = _body(body)
    if not body:
        raise InvalidRequest("missing_field", "name at least one field to change")
    checked: dict[str, Any] = {}
    if "name" in body:
        checked["name"] = _name(body["name"])
    if "run" in body:
        checked["run"] = _run_body(body["run"], workspace)
    if "overlap" in body:
        checked["overlap"] = _overlap(body["overlap"])
    if "catch_up" in body:
        checked["catch_up"] = _catch_up(body["catch_up"])
    if "paused" in body:
        raise InvalidRequest("invalid_field", "pause and resume a schedule with its /pause and /resume verbs")
    with transaction.atomic():
        schedule = _locked(workspace, user, schedule_id)
        if any(f in body for f in TIMING_FIELDS):
            for field, value in _timing(body, schedule).items():
                setattr(schedule, field, value)
            now = timezone.now()
            schedule.anchor_at = now
            schedule.next_fire_at = _next_fire(schedule, now)
        for field, value in checked.items():
            setattr(schedule, "body" if field == "run" else field, value)
        try:
            with transaction.atomic():
                schedule.save()
        except IntegrityError:
            raise Conflict("name_taken", f"this workspace already has a schedule named {schedule.name!r}") from None
        changed = sorted(body)
        _event(schedule, user, "changed", {"fields": changed, **{k: v for k, v in _summary(schedule).items() if k in changed}})
    return schedule


def pause(*, workspace: Workspace, user: Any, schedule_id: Any) -> Schedule:
    with transaction.atomic():
        schedule = _locked(workspace, user, schedule_id)
        if schedule.paused:
            raise Conflict("already_paused", "the schedule is paused already")
        schedule.paused = True
        schedule.save(update_fields=["paused", "updated_at"])
        _event(schedule, user, "paused")
    return schedule


def resume(*, workspace: Workspace, user: Any, schedule_id: Any) -> Schedule:
    """The times that passed while paused are not caught up: the next one is counted from now."""
    with transaction.atomic():
        schedule = _locked(workspace, user, schedule_id)
        if not schedule.paused:
            raise Conflict("not_paused", "the schedule is not paused")
        schedule.paused = False
        schedule.next_fire_at = _next_fire(schedule, timezone.now())
        schedule.save(update_fields=["paused", "next_fire_at", "updated_at"])
        _event(schedule, user, "resumed")
    return schedule


def delete(*, workspace: Workspace, user: Any, schedule_id: Any) -> str:
    with transaction.atomic():
        schedule = _locked(workspace, user, schedule_id)
        name = schedule.name
        _event(schedule, user, "deleted")
        schedule.delete()
    return name


def can_read_body(user: Any, schedule: Schedule) -> bool:
    """The stored body is content (its input): readers and operators see it, viewers do not; a
    private run's body only its owner."""
    role = role_of(user, schedule.workspace_id)
    if role is None or ROLE_RANK[Role(role)] < ROLE_RANK[Role.READER]:
        return False
    return not schedule.body.get("private") or schedule.owner_id == getattr(user, "pk", None)


def next_fire_times(schedule: Schedule, count: int = UPCOMING) -> list[datetime]:
    if schedule.paused or schedule.next_fire_at is None:
        return []
    return timing.upcoming(
        cron=schedule.cron,
        zone_name=schedule.timezone,
        interval_seconds=schedule.interval_seconds,
        anchor_at=schedule.anchor_at,
        first=schedule.next_fire_at,
        count=count,
    )


def document(user: Any, schedule: Schedule) -> dict[str, Any]:
    return {
        "id": schedule.pk,
        "name": schedule.name,
        "owner": schedule.owner.username if schedule.owner else None,
        "agent": schedule.body.get("agent"),
        "run": schedule.body if can_read_body(user, schedule) else None,
        "cron": schedule.cron or None,
        "timezone": schedule.timezone,
        "interval_seconds": schedule.interval_seconds,
        "overlap": schedule.overlap,
        "catch_up": schedule.catch_up,
        "paused": schedule.paused,
        "next_fire_times": [t.isoformat() for t in next_fire_times(schedule)],
        "last_run": str(schedule.last_run_id) if schedule.last_run_id else None,
        "queued": schedule.queued_at is not None,
        "created_at": schedule.created_at.isoformat(),
        "updated_at": schedule.updated_at.isoformat(),
    }


PAGE = 50


def _id_page(rows: Any, cursor: str | None, limit: int) -> tuple[list[Any], str | None]:
    """Newest first by id; the cursor is the last id shown (runs.selectors' opaque encoding)."""
    position = selectors.decode_cursor(cursor)
    if position is not None:
        if len(position) != 1 or isinstance(position[0], bool) or not isinstance(position[0], int):
            raise selectors.invalid_cursor()
        rows = rows.filter(pk__lt=position[0])
    page = list(rows.order_by("-id")[: limit + 1])
    more = len(page) > limit
    page = page[:limit]
    return page, selectors.encode_cursor([page[-1].pk]) if more and page else None


def firings_page(schedule: Schedule, cursor: str | None, limit: int = PAGE) -> dict[str, Any]:
    rows, next_cursor = _id_page(Firing.objects.filter(schedule=schedule), cursor, limit)
    items = [
        {
            "id": f.pk,
            "due_at": f.due_at.isoformat(),
            "fired_at": f.fired_at.isoformat(),
            "run": str(f.run_id) if f.run_id else None,
            "outcome": f.outcome,
            "error_key": f.error_key or None,
            "detail": f.detail or None,
        }
        for f in rows
    ]
    return {"items": items, "next": next_cursor}


def events_page(workspace: Workspace, cursor: str | None, limit: int = PAGE) -> dict[str, Any]:
    rows, next_cursor = _id_page(ScheduleEvent.objects.filter(workspace=workspace), cursor, limit)
    items = [
        {
            "id": e.pk,
            "at": e.at.isoformat(),
            "actor": e.actor,
            "verb": e.verb,
            "schedule": e.schedule_id,
            "schedule_name": e.schedule_name,
            "subject": e.subject,
            "changes": e.changes,
        }
        for e in rows
    ]
    return {"items": items, "next": next_cursor}


def schedules_of(workspace: Workspace) -> list[Schedule]:
    return list(Schedule.objects.filter(workspace=workspace).select_related("owner").order_by("name")[:PER_WORKSPACE_MAX])
