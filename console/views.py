"""What every console page shares: the htmx request type, selector 404s, one URL for page and
fragment, the live fragment that answers 204 when nothing changed, and the layout's context.

The console's pages (run_pages, inbox_pages, insights_pages, holds, ...) build on these; this module imports none of them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_POST
from django_htmx.middleware import HtmxDetails

from runs import kernel, selectors
from tenancy.models import Workspace
from tenancy.permissions import has_write_standing, role_of

# No change worth a swap: what ticks in the browser (relative times), the CSRF token's fresh
# mask and the back-link a refresh's own URL puts in every form.
TICKING_TEXT = re.compile(r"(<time[^>]*>)[^<]*(</time>)")
PER_REQUEST_VALUE = re.compile(r'(name="(?:csrfmiddlewaretoken|next)" value=")[^"]*(")')


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def not_found_as_404(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A selector's NotFound (a missing object or a non-member) is the console's 404."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except kernel.NotFound as error:
            raise Http404(error.detail) from None

    return wrapper


def wants_fragment(request: HtmxHttpRequest) -> bool:
    return bool(request.htmx) and not request.htmx.boosted


def fragment_or_page(
    request: HtmxHttpRequest, page: str, fragment: str, context: dict[str, Any], status: int = 200
) -> HttpResponse:
    """One URL answers the full page and, for htmx, the fragment the page includes."""
    response = render(request, fragment if wants_fragment(request) else page, context, status=status)
    patch_vary_headers(response, ("HX-Request",))
    return response


def refused_form(request: HtmxHttpRequest, error: kernel.KernelError, answer: Callable[..., HttpResponse]) -> HttpResponse:
    """A create form the kernel refused (its key and detail said): for htmx a toast, the form
    staying as typed for a correction; without JavaScript `answer(status=, error=, form=)`, the
    page again with the refusal and the form as typed."""
    said = f"{error.key}: {error.detail}"
    if wants_fragment(request):
        return toast(request, ok=False, title="Not saved:", detail=said, status=error.status)
    return answer(status=error.status, error=said, form=request.POST)


def refused_verb(request: HtmxHttpRequest, error: kernel.KernelError, answer: Callable[..., HttpResponse]) -> HttpResponse:
    """A button's verb the kernel refused: for htmx a toast, the page staying as it is; without
    JavaScript `answer(status=, error=)`, the answer that shows the refusal."""
    if wants_fragment(request):
        return toast(request, ok=False, title="Refused:", detail=error.detail, status=error.status)
    return answer(status=error.status, error=error.detail)


def fingerprint(html: str) -> str:
    stable = PER_REQUEST_VALUE.sub(r"\1\2", TICKING_TEXT.sub(r"\1\2", html))
    return hashlib.sha256(stable.encode()).hexdigest()[:32]


def live_fragment(
    request: HtmxHttpRequest,
    page: str,
    fragment: str,
    context: dict[str, Any],
    *,
    state: dict[str, Any] | None = None,
    extra: str = "",
) -> HttpResponse:
    """A live container's page and refresh. The fragment ends with its live state (the
    fingerprint of what it shows, and any position in `state`), which the container sends
    back as `seen`: a refresh whose fragment is what the browser already shows answers 204,
    which htmx swaps as nothing.

    `extra` is markup that rides along out of band (the run page's new trace rows); a refresh
    with extra markup is never a 204.
    """
    html = render_to_string(fragment, context, request=request)
    seen = fingerprint(html)
    if not wants_fragment(request):
        response = render(request, page, context | {"fragment": html + live_state(seen, state)})
    elif request.GET.get("seen") == seen and not extra:
        response = HttpResponse(status=204)
    else:
        response = HttpResponse(html + live_state(seen, state) + extra)
    patch_vary_headers(response, ("HX-Request",))
    return response


def live_state(seen: str, state: dict[str, Any] | None, *, oob: str = "") -> str:
    """The live state a container sends back; `oob` (a selector) replaces the container's own out
    of band, for an answer that changes what the container shows without being its refresh."""
    return render_to_string("console/_live_state.html", {"seen": seen, "state": state or {}, "oob": oob})


def toast(request: HttpRequest, *, ok: bool, title: str, detail: str, run: Any = None, status: int = 200) -> HttpResponse:
    """What an htmx POST answers: a toast on top of #toasts. A refusal keeps its status (403,
    404, 409); htmx swaps no error by default, so static/js/oz0.js swaps an answer that names
    #toasts as its target and makes a toast of any other error."""
    context = {"ok": ok, "title": title, "detail": detail, "run": run}
    response = render(request, "console/_toast.html", context, status=status)
    if request.headers.get("HX-Target") != "toasts":
        # Only when the form aimed elsewhere: htmx resolves a retarget from the form, and a form
        # the live list removed while its answer was on the way finds no #toasts from there.
        response["HX-Retarget"] = "#toasts"
    response["HX-Reswap"] = "afterbegin"
    return response


def workspace_context(request: HttpRequest, workspace: Workspace, section: str) -> dict[str, Any]:
    """What the layout needs: the switcher, the role, whether buttons show, the live socket."""
    role = role_of(request.user, workspace.pk)
    return {
        "workspace": workspace,
        "memberships": selectors.workspaces_of(request.user),
        "role": role,
        "can_write": has_write_standing(request.user, workspace.pk),
        "section": section,
        "live_path": f"/ws/workspaces/{workspace.slug}/",
    }


def settings_refused(request: HttpRequest, workspace: Workspace) -> HttpResponse | None:
    """A Settings section's write is for operators: anyone else gets the 403 page (a non-member
    never got this far: the selector's 404)."""
    if has_write_standing(request.user, workspace.pk):
        return None
    return render(request, "console/settings_forbidden.html", workspace_context(request, workspace, "settings"), status=403)


def console_post(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A console write: POST only (405 otherwise), signed in, a selector's NotFound as the 404."""
    return require_POST(login_required(not_found_as_404(view)))


def settings_write(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A Settings section's write (walls, approver groups, deadlines): a POST by a signed-in operator
    of the workspace `slug`, which the view is given; a non-member gets the 404, anyone else the
    403 page, and neither reaches the view."""

    @console_post
    @wraps(view)
    def wrapper(request: HtmxHttpRequest, slug: str, *args: Any, **kwargs: Any) -> HttpResponse:
        workspace = selectors.workspace_for(request.user, slug)
        if refused := settings_refused(request, workspace):
            return refused
        return view(request, workspace, *args, **kwargs)

    return wrapper


def settings_section(
    request: HtmxHttpRequest, workspace: Workspace, fragment: str, context: dict[str, Any], status: int = 200
) -> HttpResponse:
    """What a Settings section's write answers: its fragment for htmx (and for a refusal, with its
    status), the Settings page again (a redirect) without JavaScript."""
    if not wants_fragment(request) and status == 200:
        return redirect("workspace_settings", slug=workspace.slug)
    return render(request, fragment, workspace_context(request, workspace, "settings") | context, status=status)
