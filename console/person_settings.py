"""A person's own console settings (issue 30.8): the time zone the pages render times in.

`PersonTimeZoneMiddleware` activates the signed-in person's zone for every console page (Django's
`date` filter and `localtime` then show times in it); the zone rides in the session so a page costs
no query for it, and is read from `PersonSettings` once per session. The API answers ISO times
with their offset and is left alone.
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Callable
from functools import cache

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from console.models import PersonSettings

SESSION_KEY = "oz0_time_zone"
DEFAULT_ZONE = "UTC"
ZONE_MAX = 64


@cache
def zone_names() -> tuple[str, ...]:
    """The IANA zones this machine knows, sorted (the form's choices)."""
    return tuple(sorted(name for name in zoneinfo.available_timezones() if len(name) <= ZONE_MAX))


@cache
def _zone_set() -> frozenset[str]:
    return frozenset(zone_names())


def is_zone(name: object) -> bool:
    return isinstance(name, str) and name in _zone_set()


def zone_of(request: HttpRequest) -> str:
    """The signed-in person's zone: the session's, else their settings' (then kept in the session)."""
    session = getattr(request, "session", None)
    name = session.get(SESSION_KEY) if session is not None else None
    if not is_zone(name):
        pk = request.user.pk
        row = PersonSettings.objects.filter(user_id=pk).values_list("time_zone", flat=True).first() if pk is not None else None
        name = row if is_zone(row) else DEFAULT_ZONE
        if session is not None:
            session[SESSION_KEY] = name
    return str(name)


class PersonTimeZoneMiddleware:
    """Render the console's pages in the signed-in person's time zone (UTC until they choose one)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith(("/api/", "/static/")) or not request.user.is_authenticated:
            return self.get_response(request)
        timezone.activate(zoneinfo.ZoneInfo(zone_of(request)))
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()


@require_http_methods(["GET", "POST"])
@login_required
def person_settings(request: HttpRequest) -> HttpResponse:
    """Your settings: the time zone every page shows times in. A zone this machine does not know
    is refused (400) and nothing changes."""
    current = zone_of(request)
    if request.method == "GET":
        return _page(request, current)
    chosen = request.POST.get("time_zone", "")
    if not is_zone(chosen):
        shown = chosen[:ZONE_MAX]
        return _page(
            request, current, error=f"{shown!r} is not a time zone this server knows (e.g. Europe/Paris, UTC)", status=400
        )
    PersonSettings.objects.update_or_create(user_id=request.user.pk, defaults={"time_zone": chosen})
    request.session[SESSION_KEY] = chosen
    messages.success(request, f"Times now show in {chosen}.")
    return redirect("person_settings")


def _page(request: HttpRequest, current: str, *, error: str | None = None, status: int = 200) -> HttpResponse:
    context = {"current": current, "zones": zone_names(), "error": error, "now": timezone.now()}
    return render(request, "console/person_settings.html", context, status=status)
