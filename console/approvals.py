"""Approving with a safety net: edit a call's arguments, then approve it; approve many identical
calls in one step, after a preview.

Edit-then-approve is a verb like the others (`console.verbs.acting`: POST, signed in, the run
loaded once, operator standing, a refusal told as what happened); the kernel changes the args and
the approval in one transaction (`kernel.approve_edited`). Approve many previews the pending calls
identical to one (same tool and digest, across runs: `inbox.approvals.identical_calls`), then
approves exactly those shown, each under its own run's lock, and says what happened to each.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from console.verbs import PAST_TENSE, acting, done, last_decision
from console.views import HtmxHttpRequest, not_found_as_404, workspace_context
from inbox import approvals
from inbox.owners import first_approval_of
from runs import kernel
from runs import selectors as run_selectors
from runs.models import Run
from runs.schemas import parse_body
from tenancy.permissions import has_write_standing


def confirmed_effects(request: HtmxHttpRequest) -> bool:
    """Whether the person ticked "it has effects" (the console always asks for a call that is not
    replayable: the kernel refuses it unconfirmed, `effects_unconfirmed`)."""
    return request.POST.get("confirm_effects") == "1"


@acting
def approve_edited(request: HtmxHttpRequest, run: Run, key: str) -> HttpResponse:
    # The edited arguments as typed (JSON text, refused typed when it is not an object the row
    # store holds, or past the verb cap); the digest is the call the person edited.
    text = request.POST.get("args", "")
    if not text.strip():
        raise kernel.InvalidRequest("invalid_args", "give the edited arguments as a JSON object")
    args = parse_body(text.encode(), cap=settings.OZ0_VERB_BODY_MAX)
    kernel.approve_edited(
        run_id=run.pk,
        key=key,
        user=request.user,
        digest=request.POST.get("digest") or None,
        args=args,
        confirm_effects=confirmed_effects(request),
    )
    if first_approval_of(run.pk, key, request.user):
        detail = f"{key} now carries your arguments and runs once a second, different approver approves them too."
        return done(request, run, "First approval recorded", detail)
    return done(request, run, "Approved as edited", f"{key} runs with your arguments; the model reads that you edited them.")


@require_http_methods(["GET", "POST"])
@login_required
@not_found_as_404
def approve_many(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    """GET: the preview of the calls identical to `?run=&task=`. POST: approve those chosen."""
    workspace = run_selectors.workspace_for(request.user, slug)
    context = workspace_context(request, workspace, "inbox")
    if not has_write_standing(request.user, workspace.pk):
        return render(request, "inbox/approve_many.html", context | {"forbidden": True}, status=403)
    if request.method == "GET":
        run_id, key = request.GET.get("run", ""), request.GET.get("task", "")
        if not approvals.is_call_ref(run_id, key):
            raise kernel.NotFound("call")
        preview = approvals.identical_calls(request.user, workspace, run_id, key)
        return render(request, "inbox/approve_many.html", context | {"preview": preview, "run_id": run_id, "key": key})
    try:
        calls = approvals.parse_calls(request.POST.getlist("call"))
        outcomes = approvals.approve_calls(
            request.user, workspace, calls, digest=request.POST.get("digest"), confirm_effects=confirmed_effects(request)
        )
    except kernel.KernelError as error:
        return render(request, "inbox/approve_many.html", context | {"error": error}, status=error.status)
    for outcome in outcomes:
        if outcome["outcome"] == "not_pending":
            outcome["detail"] = decided_meanwhile(outcome["run"], outcome["task"])
    approved = sum(1 for o in outcomes if o["outcome"] == "approved")
    return render(request, "inbox/approve_many.html", context | {"outcomes": outcomes, "approved": approved})


def decided_meanwhile(run_id: str, key: str) -> str:
    """Who decided a call first and what it is now (a lost race told as news)."""
    decision = last_decision(run_id, key)
    verb = PAST_TENSE.get(decision["verb"] or "", decision["verb"] or "decided")
    who = f" by {decision['actor']}" if decision["actor"] else ""
    return f"already {verb}{who}; it is now {str(decision['status']).replace('_', ' ')}"
