"""A workspace's Schedules page: its schedules with their next fire times and last firing; for
operators, a create form and pause/resume/delete buttons. One fragment (`_schedules.html`)
serves the page, every htmx answer, and a refusal shown in the form."""

from __future__ import annotations

from functools import partial
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET

from console.views import (
    HtmxHttpRequest,
    console_post,
    fragment_or_page,
    not_found_as_404,
    refused_form,
    refused_verb,
    wants_fragment,
    workspace_context,
)
from runs import kernel, selectors
from runs.schemas import parse_body
from schedules import services
from schedules.models import OVERLAPS, Firing
from tenancy.models import Workspace
from tenancy.permissions import has_write_standing

INPUT_MAX = 64 * 1024


def _context(request: HtmxHttpRequest, workspace: Workspace, **extra: Any) -> dict[str, Any]:
    rows = []
    for schedule in services.schedules_of(workspace):
        last = Firing.objects.filter(schedule=schedule).order_by("-id").first()
        rows.append({"schedule": schedule, "next": services.next_fire_times(schedule, 3), "last": last})
    return {
        **workspace_context(request, workspace, "schedules"),
        "rows": rows,
        "overlaps": OVERLAPS,
        "catch_up_max": services.CATCH_UP_MAX,
        "min_interval": int(settings.OZ0_SCHEDULE_MIN_INTERVAL_SECONDS),
        "form": {},
        **extra,
    }


@require_GET
@login_required
@not_found_as_404
def schedules_page(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    workspace = selectors.workspace_for(request.user, slug)
    return fragment_or_page(request, "console/schedules.html", "console/_schedules.html", _context(request, workspace))


def _form_body(post: Any) -> dict[str, Any]:
    """The form's fields as the API's body; the run's input is JSON text (blank: none)."""
    run: dict[str, Any] = {"agent": post.get("agent", "").strip()}
    text = post.get("input", "").strip()
    if text:
        run["input"] = parse_body(text.encode(), cap=INPUT_MAX)
    body: dict[str, Any] = {"name": post.get("name", "").strip(), "run": run}
    body["overlap"] = post.get("overlap", "skip")
    catch_up = post.get("catch_up", "").strip()
    body["catch_up"] = int(catch_up) if catch_up.isdigit() and len(catch_up) < 6 else (catch_up or 1)
    if post.get("timing") == "interval":
        interval = post.get("interval_seconds", "").strip()
        body["interval_seconds"] = int(interval) if interval.isdigit() and len(interval) < 12 else interval
    else:
        body["cron"] = post.get("cron", "")
        body["timezone"] = post.get("timezone", "").strip() or "UTC"
    return body


def _answer(request: HtmxHttpRequest, workspace: Workspace, status: int = 200, **extra: Any) -> HttpResponse:
    return fragment_or_page(
        request, "console/schedules.html", "console/_schedules.html", _context(request, workspace, **extra), status
    )


@console_post
def schedule_create(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    workspace = selectors.workspace_for(request.user, slug)
    if not has_write_standing(request.user, workspace.pk):
        return _answer(request, workspace, status=403, error="Creating a schedule needs the operator role.")
    try:
        schedule = services.create(workspace=workspace, user=request.user, body=_form_body(request.POST))
    except kernel.KernelError as error:
        return refused_form(request, error, partial(_answer, request, workspace))
    if not wants_fragment(request):
        return redirect("schedules", slug=workspace.slug)
    return _answer(request, workspace, notice=f"Created {schedule.name}.")


def _verb(request: HtmxHttpRequest, slug: str, schedule_id: int, verb: str) -> HttpResponse:
    workspace = selectors.workspace_for(request.user, slug)
    act = {"pause": services.pause, "resume": services.resume, "delete": services.delete}[verb]
    try:
        done = act(workspace=workspace, user=request.user, schedule_id=schedule_id)
    except kernel.KernelError as error:
        return refused_verb(request, error, partial(_answer, request, workspace))
    if not wants_fragment(request):
        return redirect("schedules", slug=workspace.slug)
    name = done if isinstance(done, str) else getattr(done, "name", "")
    words = {"pause": "Paused", "resume": "Resumed", "delete": "Deleted"}[verb]
    return _answer(request, workspace, notice=f"{words} {name}.")


@console_post
def schedule_pause(request: HtmxHttpRequest, slug: str, schedule_id: int) -> HttpResponse:
    return _verb(request, slug, schedule_id, "pause")


@console_post
def schedule_resume(request: HtmxHttpRequest, slug: str, schedule_id: int) -> HttpResponse:
    return _verb(request, slug, schedule_id, "resume")


@console_post
def schedule_delete(request: HtmxHttpRequest, slug: str, schedule_id: int) -> HttpResponse:
    return _verb(request, slug, schedule_id, "delete")
