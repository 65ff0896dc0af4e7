"""Every verb a person can use on a run, one small view each.

`acting` does what every verb shares: POST only, signed in, the run loaded once (a non-member
gets 404), write standing (403 otherwise; deciding a call or a question also needs to read it,
403 `content_hidden`), and a kernel refusal told as what happened (a
`Conflict` because someone else got there first is news, never an error page). A verb view
then calls one kernel function and says what it did.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from console.views import HtmxHttpRequest, not_found_as_404, toast
from inbox.owners import first_approval_of
from runs import kernel, selectors
from runs.models import Run, Task, TraceEvent
from runs.schemas import parse_body
from tenancy.permissions import has_write_standing

REASON_MAX = 2000
PAST_TENSE = {
    "approve": "approved",
    "deny": "denied",
    "retry": "retried",
    "abandon": "abandoned",
    "abandon_and_cancel": "abandoned and canceled",
    "compact": "compacted",
    "cancel": "canceled",
    "answer": "answered",
    "resolve": "resolved",
    "completed": "answered",
}
REFUSAL_TITLES = {
    "not_a_candidate": "No longer repairable",
    "run_finished": "The run has finished",
    "run_canceling": "The run is being canceled",
    "model_route_spent": "Cannot retry this route",
    "not_pausable": "Cannot pause",
    "not_paused": "Not paused",
    "approval_stale": "The call changed",
    "nonreplayable_calls_made": "Confirm the calls it already made",
    "effects_unconfirmed": "Confirm the effects",
    "edit_denied_by_rule": "A rule denies the edited call",
    "edit_changes_replayability": "Not an edit we can approve",
    "not_editable": "Not editable",
    "invalid_args": "Not valid arguments",
    "invalid_json": "Not valid JSON",
    "payload_too_large": "Too large",
    "not_an_approver": "Not yours to decide",
    "same_approver": "Needs another approver",
}

Verb = Callable[..., HttpResponse]


def acting(verb: Verb) -> Verb:
    """A verb view: `verb(request, run, **task)` with the run loaded once, for an operator."""

    @wraps(verb)
    def view(request: HtmxHttpRequest, run_id: Any, **task: str) -> HttpResponse:
        try:
            run = selectors.run_for(request.user, run_id)
        except kernel.NotFound:
            return not_found(request, None, task.get("key"))
        if not has_write_standing(request.user, run.workspace_id):
            if request.htmx:
                detail = "acting on a run needs the operator role in this workspace."
                return toast(request, ok=False, title="Not allowed", detail=detail, run=run, status=403)
            return render(request, "console/forbidden.html", {"run": run}, status=403)
        try:
            return verb(request, run, **task)
        except kernel.NotFound:
            return not_found(request, run, task.get("key"))
        except kernel.ContentHidden:
            # Deciding a call or answering a question needs to read it: someone else's private run.
            detail = "deciding this needs to read it, and this private run's words are hidden from you."
            if request.htmx:
                return toast(request, ok=False, title="Not allowed", detail=detail, run=run, status=403)
            return render(request, "console/forbidden.html", {"run": run, "content_hidden": True}, status=403)
        except kernel.KernelError as error:
            return refused(request, run, task.get("key"), error)

    return require_POST(login_required(not_found_as_404(view)))


def not_found(request: HtmxHttpRequest, run: Run | None, key: str | None) -> HttpResponse:
    """A run or task that is not there (or not yours to see): a toast for htmx, else the 404 page."""
    if not request.htmx:
        raise kernel.NotFound("task" if run else "run")
    what = f"task {key}" if run and key else "that run"
    return toast(request, ok=False, title="Not found", detail=f"{what} is not there, or not yours to see.", run=run, status=404)


# ---- the verbs on one task ----


@acting
def approve(request: HtmxHttpRequest, run: Run, key: str) -> HttpResponse:
    # The digest of the arguments the page showed (a hidden field): a call changed since is refused.
    digest = request.POST.get("digest") or None
    # A call that is not replayable has effects: the card asks the person to confirm them.
    confirmed = request.POST.get("confirm_effects") == "1"
    kernel.approve(run_id=run.pk, key=key, user=request.user, digest=digest, confirm_effects=confirmed)
    if first_approval_of(run.pk, key, request.user):
        return done(request, run, "First approval recorded", f"{key} runs once a second, different approver approves it too.")
    return done(request, run, "Approved", f"{key} may run now, with exactly the arguments you saw.")


@acting
def deny(request: HtmxHttpRequest, run: Run, key: str) -> HttpResponse:
    kernel.deny(run_id=run.pk, key=key, user=request.user, reason=request.POST.get("reason", "").strip()[:REASON_MAX])
    return done(request, run, "Denied", f"{key} was denied; the model reads your reason.")


@acting
def answer(request: HtmxHttpRequest, run: Run, key: str) -> HttpResponse:
    kernel.answer(run_id=run.pk, key=key, user=request.user, value=request.POST.get("value", ""))
    return done(request, run, "Answered", f"{key} has its answer.")


@acting
def retry(request: HtmxHttpRequest, run: Run, key: str) -> HttpResponse:
    # The non-replayable calls the page listed beside the button, which the person confirmed.
    confirmed = request.POST.getlist("confirm_calls") or None
    kernel.retry(run_id=run.pk, key=key, user=request.user, confirm_calls=confirmed)
    return done(request, run, "Retried", f"{key} runs again; what its failure skipped comes back.")


@acting
def abandon(request: HtmxHttpRequest, run: Run, key: str) -> HttpResponse:
    kernel.abandon(run_id=run.pk, key=key, user=request.user)
    return done(request, run, "Abandoned", f"{key} is settled as abandoned; its dependents are skipped.")


@acting
def abandon_and_cancel(request: HtmxHttpRequest, run: Run, key: str) -> HttpResponse:
    kernel.abandon(run_id=run.pk, key=key, user=request.user, cancel_run=True)
    return done(request, run, "Abandoned and canceled", f"{key} is settled as abandoned and the run is canceled.")


@acting
def compact(request: HtmxHttpRequest, run: Run, key: str) -> HttpResponse:
    kernel.compact(run_id=run.pk, key=key, user=request.user)
    return done(request, run, "Compacting", f"{key} will be summarized and run again.")


# ---- the verbs on the whole run ----


@acting
def cancel(request: HtmxHttpRequest, run: Run) -> HttpResponse:
    kernel.cancel_run(run_id=run.pk, user=request.user, reason=request.POST.get("reason", "").strip()[:REASON_MAX])
    return done(request, run, "Canceling", "the run stops: unstarted work is canceled, running calls are told to stop.")


@acting
def pause(request: HtmxHttpRequest, run: Run) -> HttpResponse:
    kernel.pause_run(run_id=run.pk, user=request.user)
    return done(request, run, "Paused", "no new work starts until you resume.")


@acting
def resume(request: HtmxHttpRequest, run: Run) -> HttpResponse:
    kernel.resume_run(run_id=run.pk, user=request.user)
    return done(request, run, "Resumed", "ready work starts again.")


@acting
def append(request: HtmxHttpRequest, run: Run) -> HttpResponse:
    """Append tasks from a JSON textarea: a list of tasks, or {"tasks": [...], "deliverable": ...}."""
    body = parse_body(request.POST.get("tasks", "").encode())
    if isinstance(body, list):
        body = {"tasks": body}
    if not isinstance(body, dict):
        raise kernel.InvalidRequest("invalid_request", "give a JSON list of tasks, or an object with `tasks`")
    kernel.append(run_id=run.pk, user=request.user, body=body)
    keys = ", ".join(str(t.get("key")) for t in body.get("tasks") or [] if isinstance(t, dict))
    return done(request, run, "Appended", f"added {keys or 'the tasks'} to the run.")


# ---- what a verb answers ----


def done(request: HtmxHttpRequest, run: Run, title: str, detail: str) -> HttpResponse:
    return outcome(request, run, ok=True, title=title, detail=detail)


def outcome(request: HtmxHttpRequest, run: Run, *, ok: bool, title: str, detail: str) -> HttpResponse:
    """For htmx: a toast plus a signal that makes every live fragment on the page refresh.
    Without JavaScript: a flash message and a redirect back."""
    if request.htmx:
        response = toast(request, ok=ok, title=title, detail=detail, run=run)
        response["HX-Trigger"] = "oz0:changed"
        return response
    messages.add_message(request, messages.SUCCESS if ok else messages.WARNING, f"{title}: {detail}")
    return redirect(back(request, run))


def back(request: HttpRequest, run: Run) -> str:
    target = request.POST.get("next") or ""
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        return target
    return reverse("run", args=[run.pk])


DECISION_VIEWS = frozenset({"task_approve", "task_approve_edited", "task_deny", "task_answer"})


def refused(request: HtmxHttpRequest, run: Run, key: str | None, error: kernel.KernelError) -> HttpResponse:
    """Tell the person what happened instead of the error: who decided, and what the task is now."""
    # A decision that lost to another whose run has since finished lost a race; the run closing
    # after it is not the news.
    deciding = request.resolver_match is not None and request.resolver_match.url_name in DECISION_VIEWS
    lost_race = isinstance(error, kernel.Conflict) and (
        error.key == "not_pending"
        or (
            deciding
            and error.key == "run_finished"
            and TraceEvent.objects.filter(run_id=run.pk, task_key=key, event="verb").exists()
        )
    )
    if lost_race and key:
        decision = last_decision(run, key)
        who = f" by {decision['actor']}" if decision["actor"] else ""
        verb = PAST_TENSE.get(decision["verb"] or "", decision["verb"] or "decided")
        status = str(decision["status"]).replace("_", " ")
        detail = f"{key} was already {verb.replace('_', ' ')}{who}; it is now {status}."
        return outcome(request, run, ok=False, title="Already decided", detail=detail)
    title = REFUSAL_TITLES.get(error.key, "Not done" if isinstance(error, kernel.Conflict) else "Refused")
    return outcome(request, run, ok=False, title=title, detail=error.detail or error.key)


def last_decision(run: Run | str, key: str) -> dict[str, Any]:
    """Who last acted on a task and how (what a person who lost a race is told); `run` or its id."""
    run_id = run.pk if isinstance(run, Run) else run
    events = TraceEvent.objects.filter(run_id=run_id, task_key=key).order_by("-seq")
    event = events.filter(event="verb").first() or events.exclude(actor__in=("", "worker", "model", "kernel")).first()
    task = Task.objects.filter(run_id=run_id, key=key).only("status").first()
    return {
        "verb": ((event.data or {}).get("verb") or event.to_status) if event else None,
        "actor": event.actor if event else "",
        "at": event.at if event else None,
        "status": task.status if task else None,
    }
