"""The console's run pages and every verb a person can use on a run.

Views are short: resolve the object through a selector (a non-member gets 404),
check write standing for verbs, call one kernel function, render. A verb the kernel
refuses because someone else got there first (`Conflict`) is told to the person as
what happened, never as an error page.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST
from django_htmx.middleware import HtmxDetails

from inbox import selectors as inbox_selectors
from runs import kernel, selectors
from runs.kernel.errors import Conflict, KernelError, NotFound
from runs.kernel.validation import parse_body
from runs.models import RUN_FINISHED, Run, Workspace
from runs.permissions import has_write_standing, role_of

RUN_STATUS_FILTERS = ("running", "needs_attention", "paused", "pending", "canceling", "completed", "canceled")
TASK_VERBS: dict[str, str] = {
    "approve": "Approved",
    "deny": "Denied",
    "answer": "Answered",
    "retry": "Retried",
    "abandon": "Abandoned",
    "compact": "Compacting",
}
RUN_VERBS: dict[str, str] = {"cancel": "Canceling", "pause": "Paused", "resume": "Resumed", "append": "Appended"}
TRACE_LIMIT = 2000
PAST_TENSE = {
    "approve": "approved",
    "deny": "denied",
    "retry": "retried",
    "abandon": "abandoned",
    "compact": "compacted",
    "cancel": "canceled",
    "completed": "answered",
}


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def not_found_as_404(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A selector's NotFound (a missing object or a non-member) is the console's 404."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except NotFound as error:
            raise Http404(error.detail) from None

    return wrapper


def fragment_or_page(request: HtmxHttpRequest, page: str, fragment: str, context: dict[str, Any]) -> HttpResponse:
    """One URL answers the full page and, for htmx, the fragment the page includes."""
    wants_fragment = bool(request.htmx) and not request.htmx.boosted
    response = render(request, fragment if wants_fragment else page, context)
    patch_vary_headers(response, ("HX-Request",))
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


@login_required
def home(request: HttpRequest) -> HttpResponse:
    memberships = list(selectors.workspaces_of(request.user))
    if len(memberships) == 1:
        return redirect("inbox", slug=memberships[0].workspace.slug)
    return render(request, "runs/home.html", {"memberships": memberships})


@login_required
def workspace_home(request: HttpRequest, slug: str) -> HttpResponse:
    return redirect("inbox", slug=slug)


@require_GET
@login_required
@not_found_as_404
def runs_list(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    workspace = selectors.workspace_for(request.user, slug)
    status = request.GET.get("status") or None
    if status and any(s not in RUN_STATUS_FILTERS for s in status.split(",")):
        status = None
    agent = request.GET.get("agent") or None
    try:
        page = selectors.runs_page(
            request.user, workspace, status=status, agent=agent, cursor=request.GET.get("cursor"), limit=50
        )
    except KernelError:
        page = {"count": 0, "items": [], "next": None}
    context = workspace_context(request, workspace, "runs") | {
        "page": page,
        "status": status or "",
        "agent": agent or "",
        "statuses": RUN_STATUS_FILTERS,
        "more": bool(request.GET.get("cursor")),
    }
    # "Load more" appends rows; the live refresh replaces the table with its count.
    fragment = "runs/_run_rows.html" if context["more"] else "runs/_runs_table.html"
    return fragment_or_page(request, "runs/runs.html", fragment, context)


@require_GET
@login_required
@not_found_as_404
def holds(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    workspace = selectors.workspace_for(request.user, slug)
    context = workspace_context(request, workspace, "holds") | {"holds": inbox_selectors.held_runs(request.user, workspace)}
    return fragment_or_page(request, "runs/holds.html", "runs/_holds.html", context)


@require_GET
@login_required
@not_found_as_404
def run_detail(request: HtmxHttpRequest, run_id: Any) -> HttpResponse:
    run = selectors.run_for(request.user, run_id)
    doc = selectors.run_document(request.user, run)
    trace = selectors.trace_documents(request.user, run, limit=TRACE_LIMIT)
    repair = None
    if run.status not in RUN_FINISHED and any(t["status"] in ("failed", "timed_out", "uncertain") for t in doc["tasks"]):
        repair = inbox_selectors.hold_documents(request.user, [run])[0]
    context = workspace_context(request, run.workspace, "runs") | {
        "run": run,
        "doc": doc,
        "trace": trace,
        "trace_truncated": len(trace) >= TRACE_LIMIT,
        "repair": repair,
        "waiting": [t for t in doc["tasks"] if t["status"] in ("needs_approval", "awaiting_input")],
        "model_changes": [
            (t["key"], t["result"]["model_change"]) for t in doc["tasks"] if (t["result"] or {}).get("model_change")
        ],
        "finished": run.status in RUN_FINISHED,
        "live_path": f"/ws/runs/{run.pk}/",
    }
    return fragment_or_page(request, "runs/run.html", "runs/_run_body.html", context)


# ---- verbs ----


def _back(request: HttpRequest, run: Run) -> str:
    target = request.POST.get("next") or ""
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        return target
    return reverse("run", args=[run.pk])


def _outcome(request: HtmxHttpRequest, run: Run, *, ok: bool, title: str, detail: str) -> HttpResponse:
    """For htmx: a toast plus a signal that makes every live fragment on the page refresh.
    Without JavaScript: a flash message and a redirect back."""
    if request.htmx:
        response = render(request, "console/_toast.html", {"ok": ok, "title": title, "detail": detail, "run": run})
        response["HX-Trigger"] = "oz0:changed"
        return response
    messages.add_message(request, messages.SUCCESS if ok else messages.WARNING, f"{title}: {detail}")
    return redirect(_back(request, run))


def _refused(request: HtmxHttpRequest, run: Run, key: str | None, error: KernelError) -> HttpResponse:
    """Tell the person what happened instead of the error: who decided, and what the task is now."""
    if isinstance(error, Conflict) and error.key == "not_pending" and key:
        decision = inbox_selectors.last_decision(run, key)
        who = f" by {decision['actor']}" if decision["actor"] else ""
        verb = PAST_TENSE.get(decision["verb"] or "", decision["verb"] or "decided")
        return _outcome(
            request,
            run,
            ok=False,
            title="Already decided",
            detail=f"{key} was already {verb.replace('_', ' ')}{who}; it is now {str(decision['status']).replace('_', ' ')}.",
        )
    titles = {
        "not_a_candidate": "No longer repairable",
        "run_finished": "The run has finished",
        "run_canceling": "The run is being canceled",
        "model_route_spent": "Cannot retry this route",
        "not_pausable": "Cannot pause",
        "not_paused": "Not paused",
    }
    title = titles.get(error.key, "Not done" if isinstance(error, Conflict) else "Refused")
    return _outcome(request, run, ok=False, title=title, detail=error.detail or error.key)


def _verb_run(request: HttpRequest, run_id: Any) -> Run | HttpResponse:
    run = selectors.run_for(request.user, run_id)
    if not has_write_standing(request.user, run.workspace_id):
        return render(request, "console/forbidden.html", {"run": run}, status=403)
    return run


@require_POST
@login_required
@not_found_as_404
def task_verb(request: HtmxHttpRequest, run_id: Any, key: str, verb: str) -> HttpResponse:
    if verb not in TASK_VERBS:
        raise Http404("no such verb")
    run = _verb_run(request, run_id)
    if isinstance(run, HttpResponse):
        return run
    kwargs: dict[str, Any] = {}
    if verb == "deny":
        kwargs["reason"] = request.POST.get("reason", "").strip()[:2000]
    if verb == "answer":
        kwargs["value"] = request.POST.get("value", "")
    try:
        getattr(kernel, verb)(run_id=run.pk, key=key, user=request.user, **kwargs)
    except KernelError as error:
        if isinstance(error, NotFound):
            raise
        return _refused(request, run, key, error)
    return _outcome(request, run, ok=True, title=TASK_VERBS[verb], detail=_done_sentence(verb, key))


def _done_sentence(verb: str, key: str) -> str:
    return {
        "approve": f"{key} may run now.",
        "deny": f"{key} was denied; the model reads your reason.",
        "answer": f"{key} has its answer.",
        "retry": f"{key} runs again; what its failure skipped comes back.",
        "abandon": f"{key} is settled as abandoned; its dependents are skipped.",
        "compact": f"{key} will be summarized and run again.",
        "cancel": "the run stops: unstarted work is canceled, running calls are told to stop.",
        "pause": "no new work starts until you resume.",
        "resume": "ready work starts again.",
    }.get(verb, key)


@require_POST
@login_required
@not_found_as_404
def run_verb(request: HtmxHttpRequest, run_id: Any, verb: str) -> HttpResponse:
    if verb not in RUN_VERBS or verb == "append":
        raise Http404("no such verb")
    run = _verb_run(request, run_id)
    if isinstance(run, HttpResponse):
        return run
    try:
        if verb == "cancel":
            kernel.cancel_run(run_id=run.pk, user=request.user, reason=request.POST.get("reason", "").strip()[:2000])
        elif verb == "pause":
            kernel.pause_run(run_id=run.pk, user=request.user)
        else:
            kernel.resume_run(run_id=run.pk, user=request.user)
    except KernelError as error:
        if isinstance(error, NotFound):
            raise
        return _refused(request, run, None, error)
    return _outcome(request, run, ok=True, title=RUN_VERBS[verb], detail=_done_sentence(verb, ""))


@require_POST
@login_required
@not_found_as_404
def append(request: HtmxHttpRequest, run_id: Any) -> HttpResponse:
    """Append tasks from a JSON textarea: a list of tasks, or {"tasks": [...], "deliverable": ...}."""
    run = _verb_run(request, run_id)
    if isinstance(run, HttpResponse):
        return run
    try:
        body = parse_body(request.POST.get("tasks", "").encode())
        if isinstance(body, list):
            body = {"tasks": body}
        if not isinstance(body, dict):
            from runs.kernel.errors import InvalidRequest

            raise InvalidRequest("invalid_request", "give a JSON list of tasks, or an object with `tasks`")
        kernel.append(run_id=run.pk, user=request.user, body=body)
    except KernelError as error:
        if isinstance(error, NotFound):
            raise
        return _refused(request, run, None, error)
    keys = ", ".join(str(t.get("key")) for t in body.get("tasks") or [] if isinstance(t, dict))
    return _outcome(request, run, ok=True, title="Appended", detail=f"added {keys or 'the tasks'} to the run.")
