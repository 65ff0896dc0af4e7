"""A workspace's Triggers page: the URLs outside systems post to, each with its agent, input
template, idempotency key and its last deliveries; for operators, a create form (the secret is
shown once, in the answer) and a delete button. One fragment (`_triggers.html`) serves the page
and every htmx answer."""

from __future__ import annotations

from functools import partial
from typing import Any

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
from schedules import triggers
from schedules.models import TriggerDelivery
from tenancy.models import Workspace
from tenancy.permissions import has_write_standing

TEMPLATE_MAX = 16 * 1024
RECENT_DELIVERIES = 5


def _context(request: HtmxHttpRequest, workspace: Workspace, **extra: Any) -> dict[str, Any]:
    rows = []
    for trigger in triggers.triggers_of(workspace):
        recent = list(TriggerDelivery.objects.filter(trigger=trigger).order_by("-id")[:RECENT_DELIVERIES])
        rows.append({"trigger": trigger, "doc": triggers.document(trigger), "recent": recent})
    return {**workspace_context(request, workspace, "triggers"), "rows": rows, "form": {}, **extra}


@require_GET
@login_required
@not_found_as_404
def triggers_page(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    workspace = selectors.workspace_for(request.user, slug)
    return fragment_or_page(request, "console/triggers.html", "console/_triggers.html", _context(request, workspace))


def _form_body(post: Any) -> dict[str, Any]:
    """The form's fields as the API's body: the template is JSON text (blank: none)."""
    body: dict[str, Any] = {"name": post.get("name", "").strip(), "run": {"agent": post.get("agent", "").strip()}}
    text = post.get("input_template", "").strip()
    if text:
        body["input_template"] = parse_body(text.encode(), cap=TEMPLATE_MAX)
    where, value = post.get("key_in", "header"), post.get("key", "").strip()
    if where not in ("header", "field"):
        raise kernel.InvalidRequest("invalid_idempotency", "the key is in a header or a field")
    body["idempotency"] = {where: value}
    return body


def _answer(request: HtmxHttpRequest, workspace: Workspace, status: int = 200, **extra: Any) -> HttpResponse:
    return fragment_or_page(
        request, "console/triggers.html", "console/_triggers.html", _context(request, workspace, **extra), status
    )


@console_post
def trigger_create(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    workspace = selectors.workspace_for(request.user, slug)
    if not has_write_standing(request.user, workspace.pk):
        return _answer(request, workspace, status=403, error="Creating a trigger needs the operator role.")
    try:
        trigger, secret = triggers.create(workspace=workspace, user=request.user, body=_form_body(request.POST))
    except kernel.KernelError as error:
        return refused_form(request, error, partial(_answer, request, workspace))
    # The secret is in this answer only (never stored, never shown again): a plain POST gets the
    # page with it too, not a redirect that would lose it.
    return _answer(
        request, workspace, created=trigger, secret=secret, url=request.build_absolute_uri(triggers.document(trigger)["url"])
    )


@console_post
def trigger_delete(request: HtmxHttpRequest, slug: str, trigger_id: int) -> HttpResponse:
    workspace = selectors.workspace_for(request.user, slug)
    try:
        name = triggers.trigger_for(workspace, trigger_id).name
        triggers.delete(workspace=workspace, user=request.user, trigger_id=trigger_id)
    except kernel.KernelError as error:
        return refused_verb(request, error, partial(_answer, request, workspace))
    if not wants_fragment(request):
        return redirect("triggers", slug=workspace.slug)
    return _answer(request, workspace, notice=f"Deleted {name}: its URL starts nothing now.")
