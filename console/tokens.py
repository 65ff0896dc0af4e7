"""The console page of one's own API tokens: list them, make one (shown once), revoke one."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from runs import selectors
from tenancy import tokens


def _page(request: HttpRequest, *, new_token: str | None = None, error: str | None = None, status: int = 200) -> HttpResponse:
    now = timezone.now()
    rows = [{"row": row, "status": tokens.status_of(row, now)} for row in tokens.tokens_of(request.user)[:200]]
    context: dict[str, Any] = {
        "rows": rows,
        "new_token": new_token,
        "error": error,
        "memberships": selectors.workspaces_of(request.user),
        "label_max": tokens.LABEL_MAX,
        "expires_max": tokens.EXPIRES_MAX_DAYS,
        "form": request.POST if error else {},
    }
    response = render(request, "console/tokens.html", context, status=status)
    # The page may hold a fresh token: never keep it in a cache.
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_http_methods(["GET", "POST"])
def token_list(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _page(request)
    try:
        token, _ = tokens.issue(
            user=request.user, label=request.POST.get("label", ""), expires_in_days=request.POST.get("expires_in_days")
        )
    except tokens.TokenRefused as error:
        return _page(request, error=error.detail, status=409 if error.status == 409 else 400)
    return _page(request, new_token=token)


@login_required
@require_POST
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    try:
        row = tokens.revoke(token_id=token_id, user=request.user)
    except tokens.TokenRefused as error:
        if error.status == 404:
            raise Http404("no such token") from None
        messages.warning(request, error.detail)
        return redirect("tokens")
    messages.success(request, f"Revoked token {row.hint or row.pk}… ({row.label or 'no label'}): it works no more.")
    return redirect("tokens")
