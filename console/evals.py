"""Regression cases in the console (issue 31 item 5): the "Keep as a regression case" button of
a failed run's page (operators), and a workspace's Regression cases page: its cases by agent
with their last result per version, recent evals, and for operators a "Run against version N"
form and a Delete button. One fragment (`console/_regression_cases.html`) serves the page, every
htmx answer, and its own refresh while an eval's runs are going (evals.cases and evals.running
decide; the words follow the run's rule, F11, F12)."""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from console.views import HtmxHttpRequest, fragment_or_page, not_found_as_404, toast, wants_fragment, workspace_context
from evals import cases, running
from evals.models import Eval, EvalResult, RegressionCase
from oz0agents.models import AgentVersion
from runs import kernel, selectors
from tenancy.models import Workspace
from tenancy.permissions import has_write_standing

VERSION_COLUMNS = 4
INPUT_SHOWN = 160


def _input_text(case: RegressionCase) -> str:
    text = json.dumps(case.input, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= INPUT_SHOWN else text[: INPUT_SHOWN - 1] + "…"


def _agent_rows(user: Any, workspace: Workspace) -> list[dict[str, Any]]:
    rows = list(cases.cases_of(workspace))
    groups = cases.group_ids(rows)
    last = running.last_results(workspace)
    versions: dict[str, list[int]] = {}
    for name, number in AgentVersion.objects.filter(agent__workspace=workspace).values_list("agent__name", "version"):
        versions.setdefault(name, []).append(number)
    agents: dict[str, dict[str, Any]] = {}
    for case in rows:
        agent = agents.setdefault(case.agent_name, {"name": case.agent_name, "cases": [], "tried": set()})
        results = last.get(case.pk, {})
        agent["tried"].update(results)
        content = cases.content_visible(user, case)
        agent["cases"].append(
            {
                "case": case,
                "group": groups.get((case.workspace_id, case.fingerprint)),
                "content": content,
                "input": _input_text(case) if content else "",
                "results": results,
            }
        )
    for agent in agents.values():
        tried = sorted(agent.pop("tried"), reverse=True)[:VERSION_COLUMNS]
        agent["columns"] = tried
        for row in agent["cases"]:
            row["cells"] = [row["results"].get(v) for v in tried]
        agent["versions"] = sorted(versions.get(agent["name"], []), reverse=True)
    return [agents[name] for name in sorted(agents)]


def _context(request: HtmxHttpRequest, workspace: Workspace, **extra: Any) -> dict[str, Any]:
    evals = running.recent(workspace)
    for evaluation in evals:
        if evaluation.finished_at is None:
            running.refresh(evaluation)
    tallies = {e.pk: running.counts(EvalResult.objects.filter(eval=e)) for e in evals}
    return {
        **workspace_context(request, workspace, "regression-cases"),
        "agents": _agent_rows(request.user, workspace),
        "evals": [{"eval": e, "counts": tallies[e.pk]} for e in evals],
        "going": any(e.finished_at is None for e in evals),
        **extra,
    }


@require_GET
@login_required
@not_found_as_404
def regression_cases(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    workspace = selectors.workspace_for(request.user, slug)
    return fragment_or_page(
        request, "console/regression_cases.html", "console/_regression_cases.html", _context(request, workspace)
    )


def _answer(request: HtmxHttpRequest, workspace: Workspace, status: int = 200, **extra: Any) -> HttpResponse:
    page = "console/_regression_cases.html" if wants_fragment(request) else "console/regression_cases.html"
    return render(request, page, _context(request, workspace, **extra), status=status)


def _refused(request: HtmxHttpRequest, workspace: Workspace, error: kernel.KernelError) -> HttpResponse:
    if wants_fragment(request):
        return toast(request, ok=False, title="Refused:", detail=f"{error.key}: {error.detail}", status=error.status)
    return _answer(request, workspace, status=error.status, error=f"{error.key}: {error.detail}")


@require_POST
@login_required
@not_found_as_404
def keep_case(request: HtmxHttpRequest, run_id: Any) -> HttpResponse:
    """The run page's button: keep this failed run as a regression case (operators)."""
    run = selectors.run_for(request.user, run_id)
    try:
        case, created = cases.keep(user=request.user, run_id=run.pk)
    except kernel.KernelError as error:
        if wants_fragment(request):
            return toast(request, ok=False, title="Not kept:", detail=error.detail, status=error.status)
        return HttpResponse(error.detail, status=error.status, content_type="text/plain")
    page = reverse("regression_cases", args=[run.workspace.slug])
    if not wants_fragment(request):
        return redirect(f"{page}#case-{case.pk}")
    words = "Kept as" if created else "Already kept as"
    return toast(request, ok=True, title=f"{words} regression case {case.pk}.", detail=f"See {page}")


@require_POST
@login_required
@not_found_as_404
def case_delete(request: HtmxHttpRequest, slug: str, case_id: int) -> HttpResponse:
    workspace = selectors.workspace_for(request.user, slug)
    try:
        cases.delete(workspace=workspace, user=request.user, case_id=case_id)
    except kernel.KernelError as error:
        return _refused(request, workspace, error)
    if not wants_fragment(request):
        return redirect("regression_cases", slug=workspace.slug)
    return _answer(request, workspace, notice=f"Deleted case {case_id}.")


@require_POST
@login_required
@not_found_as_404
def eval_start(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    """The "Run against version N" form: an eval of one agent's cases."""
    workspace = selectors.workspace_for(request.user, slug)
    if not has_write_standing(request.user, workspace.pk):
        return _refused(request, workspace, kernel.Forbidden())
    number = str(request.POST.get("version", "")).strip()
    body = {
        "agent": str(request.POST.get("agent", "")),
        "version": int(number) if number.isdigit() and len(number) < 11 else number,
    }
    try:
        evaluation: Eval = running.start(workspace=workspace, user=request.user, body=body)
    except kernel.KernelError as error:
        return _refused(request, workspace, error)
    if not wants_fragment(request):
        return redirect("regression_cases", slug=workspace.slug)
    return _answer(request, workspace, notice=f"Eval {evaluation.pk} started: {evaluation.agent_name} v{evaluation.version}.")
