"""The console page of one's own subscriptions: list them with their status, make one, delete one."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from notify import subscriptions
from notify.models import WAIT_KINDS
from runs import kernel, selectors


def _form_body(request: HttpRequest) -> dict[str, Any]:
    post = request.POST
    interval = post.get("interval_minutes", "").strip()
    body: dict[str, Any] = {
        "workspace": post.get("workspace", ""),
        "kinds": post.getlist("kinds"),
        "agent": post.get("agent", ""),
        "email": post.get("email") == "on",
        "webhook_url": post.get("webhook_url", "").strip(),
    }
    if interval:
        body["interval_seconds"] = int(interval) * 60 if interval.isdigit() and len(interval) < 7 else -1
    return body


def _page(request: HttpRequest, *, secret: str = "", error: str = "", status: int = 200) -> HttpResponse:
    rows = [subscriptions.document(row) for row in subscriptions.subscriptions_of(request.user)[: subscriptions.PER_USER_MAX]]
    context = {
        "rows": rows,
        "secret": secret,
        "error": error,
        "memberships": selectors.workspaces_of(request.user),
        "kinds": WAIT_KINDS,
        "interval_min": subscriptions.INTERVAL_MIN // 60,
        "interval_max": subscriptions.INTERVAL_MAX // 60,
        "form": request.POST if error else {},
        "has_email": bool(request.user.email),  # type: ignore[union-attr]
    }
    response = render(request, "notify/subscriptions.html", context, status=status)
    # The page may hold a fresh webhook secret: never keep it in a cache.
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_http_methods(["GET", "POST"])
def subscription_list(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _page(request)
    try:
        _, secret = subscriptions.create(request.user, _form_body(request))
    except kernel.KernelError as error:
        return _page(request, error=error.detail, status=error.status if error.status in (400, 404, 409) else 400)
    messages.success(request, "Subscribed.")
    return _page(request, secret=secret)


@login_required
@require_POST
def subscription_delete(request: HttpRequest, subscription_id: int) -> HttpResponse:
    try:
        subscriptions.delete(request.user, subscription_id)
    except kernel.NotFound:
        raise Http404("no such subscription") from None
    messages.success(request, "Subscription deleted: it sends nothing more.")
    return redirect("subscriptions")
