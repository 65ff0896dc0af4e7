"""Evals: a workspace's regression cases of one agent run against one version of it.

An eval creates one real run per case through `runs.kernel.create_run`, as the person who
started it (the command line acts for the platform), in the case's workspace, pinned to the
version under test and marked with the arm `eval` (`Run.rollout`): a canary's arms never count
them, and every surface that shows the arm shows it. Scorecards count them as runs of their
version, as they are.

Which model answers:
- a case kept from a run of the `script` provider carries that provider's answers; when the
  version under test is scripted too and brings no `script` of its own, its run replays them
  (deterministic: the model says what it said, and the version's tools, instructions, approval
  rules and declared failures decide the rest);
- otherwise the version runs as it stands: its own script, or its real provider, on the case's input.

What the eval records, per case, once the run has an outcome (`refresh`, which every read of an
eval calls, and which the command line's --wait polls):
- `completed`: verdict `passed`;
- `failed` with another kind than the case's: `passed_other_failure` — the case's failure did
  not come back, but the run still failed, which the page and the command line show;
- `failed` with the case's kind again: `failed_again`, the one verdict that is not a pass;
- `canceled` (someone stopped it), `refused` (the kernel refused the create: its error key) or
  `skipped` (a private case someone other than its run's creator started): no verdict.
A run that holds on its failure has failed: the eval records it, then cancels the run (it was
only ever started to learn this) so that it does not wait in the Holds page for a person.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.utils import timezone

from evals.cases import ID_MAX, cases_of
from evals.models import Eval, EvalResult, RegressionCase
from oz0agents.lint import NAME_MAX, NAME_PATTERN
from oz0agents.models import Agent, AgentVersion
from runs import kernel
from runs.kernel import Conflict, Forbidden, InvalidRequest, KernelError, NotFound, whole_number
from runs.models import Finding, Run, RunStatus
from tenancy.models import Workspace
from tenancy.permissions import has_write_standing

log = logging.getLogger(__name__)

ARM = "eval"
VERSION_MAX = 2**31 - 1
CANCELED_KIND = "cancelled"
FIELDS = ("agent", "version")


def _body(body: Any) -> tuple[str, int]:
    if not isinstance(body, dict):
        raise InvalidRequest("invalid_request", "the body must be a JSON object")
    unknown = sorted(str(k)[:40] for k in set(body) - set(FIELDS))
    if unknown:
        raise InvalidRequest("unknown_field", f"unknown fields: {', '.join(unknown[:5])}")
    agent, version = body.get("agent"), body.get("version")
    if not isinstance(agent, str) or len(agent) > NAME_MAX or not NAME_PATTERN.match(agent):
        raise InvalidRequest("invalid_agent", f"`agent` must be an agent's name (lowercase, digits, `_.-`, at most {NAME_MAX})")
    number = whole_number(version)  # JSON has one number type: 2.0 is the version 2, as the document's `integer` says
    if number is None or not 1 <= number <= VERSION_MAX:
        raise InvalidRequest("invalid_version", f"`version` must be a whole number from 1 to {VERSION_MAX}")
    return agent, number


def start(*, workspace: Workspace, user: Any, body: Any) -> Eval:
    """Run the workspace's cases of `agent` against its `version`: one run per case, now. Needs
    write standing (None: the platform, for the command line)."""
    agent_name, number = _body(body)
    if user is not None and not has_write_standing(user, workspace.pk):
        raise Forbidden()
    agent = Agent.objects.filter(workspace=workspace, name=agent_name).first()
    if agent is None:
        raise NotFound("agent")
    version = AgentVersion.objects.filter(agent=agent, version=number).first()
    if version is None:
        raise NotFound("agent version")
    cases = list(cases_of(workspace, agent_name))
    if not cases:
        raise Conflict("no_cases", f"{agent_name} has no regression cases in this workspace: keep a failed run as one first")
    person = user if user is not None and user.is_authenticated else None
    evaluation = Eval.objects.create(
        workspace=workspace,
        agent_name=agent_name,
        version=number,
        started_by=person,
        actor=person.get_username() if person is not None else "kernel",
    )
    for case in cases:
        _start_case(evaluation, case, version, person)
    refresh(evaluation)
    return evaluation


def replays(case: RegressionCase, manifest: dict[str, Any]) -> bool:
    """Whether the version's run replays the case's recorded answers (the module's docstring)."""
    if case.answers is None or manifest.get("kind") == "flow" or "script" in manifest:
        return False
    routes = [str(manifest.get("model", "script")), *(str(r) for r in manifest.get("fallback_models", []))]
    return all(route.split(":", 1)[0] == "script" for route in routes)


def run_body(case: RegressionCase, manifest: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The create body of a case's run on a version, and whether it replays the case's answers."""
    body: dict[str, Any] = {"agent": case.agent_name, "private": case.private}
    if case.input is not None:
        body["input"] = case.input
    if not replays(case, manifest):
        return body, False
    # The agent's own first round (runs.kernel compiles the same from a manifest), with the case's answers.
    body["tasks"] = [
        {
            "key": "r1",
            "kind": "round",
            "model": manifest.get("model", "script"),
            "fallback_models": list(manifest.get("fallback_models", [])),
            "prompt": manifest.get("instructions", ""),
            "tools": [t for t in manifest.get("tools", []) if isinstance(t, str)],
            "script": case.answers,
        }
    ]
    return body, True


def _start_case(evaluation: Eval, case: RegressionCase, version: AgentVersion, user: Any) -> None:
    result = EvalResult(eval=evaluation, case=case, case_number=case.pk, kind_before=case.kind)
    if case.private and (user is None or user.pk != case.created_by_id):
        # Its run would show the case's words to whoever started it: only its run's creator runs it.
        result.outcome, result.reason = "skipped", "private_case"
        result.finished_at = timezone.now()
        result.save()
        return
    body, result.replayed = run_body(case, dict(version.manifest))
    try:
        with transaction.atomic():
            run, _ = kernel.create_run(
                workspace=evaluation.workspace, user=user, body=body, pinned=kernel.Pinned(version.version, ARM)
            )
    except KernelError as refused:
        result.outcome, result.reason = "refused", refused.key[:64]
        result.finished_at = timezone.now()
    else:
        result.run = run
    result.save()


def _verdict(kind_before: str, run: Run, kind: str | None) -> tuple[str, str, str] | None:
    """(outcome, kind after, verdict) of a run that has one; None while it is still going."""
    if run.status == RunStatus.COMPLETED:
        return "completed", "", "passed"
    if kind == CANCELED_KIND or (kind is None and run.status == RunStatus.CANCELED):
        return "canceled", "", "none"
    if kind is not None:
        return "failed", kind, "failed_again" if kind == kind_before else "passed_other_failure"
    return None


def refresh(evaluation: Eval) -> Eval:
    """Record the outcome of every case whose run has one (a compare-and-set on `pending`, so
    two readers record it once), cancel the held ones, and finish the eval when none is pending."""
    pending = list(evaluation.results.filter(outcome="pending").select_related("run"))
    if pending:
        run_ids = [r.run_id for r in pending if r.run_id is not None]
        kinds = dict(Finding.objects.filter(run_id__in=run_ids).order_by("-pk").values_list("run_id", "kind"))
        now = timezone.now()
        for result in pending:
            if result.run is None:
                decided: tuple[str, str, str] | None = ("canceled", "", "none")
                reason = "run_deleted"
            else:
                decided, reason = _verdict(result.kind_before, result.run, kinds.get(result.run.pk)), ""
            if decided is None:
                continue
            outcome, kind_after, verdict = decided
            won = EvalResult.objects.filter(pk=result.pk, outcome="pending").update(
                outcome=outcome, kind_after=kind_after, verdict=verdict, reason=reason, finished_at=now
            )
            if won and result.run is not None and result.run.status in kernel.OPEN_RUN_STATUSES:
                _cancel_held(evaluation, result.run)
    if evaluation.finished_at is None and not evaluation.results.filter(outcome="pending").exists():
        Eval.objects.filter(pk=evaluation.pk, finished_at__isnull=True).update(finished_at=timezone.now())
        evaluation.refresh_from_db(fields=["finished_at"])
    return evaluation


def _cancel_held(evaluation: Eval, run: Run) -> None:
    try:
        with transaction.atomic():
            kernel.cancel_run(run_id=run.pk, user=None, reason=f"eval {evaluation.pk} recorded its outcome")
    except KernelError as error:  # it ended meanwhile: nothing is left to stop
        log.info("eval %s: run %s not canceled (%s)", evaluation.pk, run.pk, error.key)


def eval_for(workspace: Workspace, eval_id: int) -> Eval:
    evaluation = Eval.objects.filter(workspace=workspace, pk=eval_id).first() if 0 < eval_id <= ID_MAX else None
    if evaluation is None:
        raise NotFound("eval")
    return evaluation


def wait(evaluation: Eval, *, timeout: float, interval: float = 1.0) -> Eval:
    """Poll until every case has an outcome or the timeout passes (the command line's --wait)."""
    deadline = time.monotonic() + timeout
    while True:
        refresh(evaluation)
        if evaluation.finished_at is not None or time.monotonic() >= deadline:
            return evaluation
        time.sleep(interval)


def result_document(result: EvalResult) -> dict[str, Any]:
    """Kinds, outcomes and ids: no words, the same for every member."""
    return {
        "case": result.case_number,
        "run": str(result.run_id) if result.run_id else None,
        "replayed": result.replayed,
        "kind_before": result.kind_before,
        "outcome": result.outcome,
        "kind_after": result.kind_after or None,
        "verdict": result.verdict,
        "passed": result.passed,
        "reason": result.reason or None,
    }


def counts(results: Iterable[EvalResult]) -> dict[str, int]:
    tally = {"cases": 0, "passed": 0, "failed": 0, "pending": 0, "no_verdict": 0}
    for result in results:
        tally["cases"] += 1
        if result.outcome == "pending":
            tally["pending"] += 1
        elif result.passed is None:
            tally["no_verdict"] += 1
        else:
            tally["passed" if result.passed else "failed"] += 1
    return tally


def document(evaluation: Eval) -> dict[str, Any]:
    results = list(evaluation.results.order_by("case_number"))
    return {
        "id": evaluation.pk,
        "agent": evaluation.agent_name,
        "version": evaluation.version,
        "started_by": evaluation.actor,
        "created_at": evaluation.created_at.isoformat(),
        "finished_at": evaluation.finished_at.isoformat() if evaluation.finished_at else None,
        "counts": counts(results),
        "results": [result_document(r) for r in results],
    }


def recent(workspace: Workspace, limit: int = 10) -> list[Eval]:
    return list(Eval.objects.filter(workspace=workspace).order_by("-id")[:limit])


def last_results(workspace: Workspace) -> dict[int, dict[int, EvalResult]]:
    """Each case's newest result per version it was run against: {case: {version: result}}."""
    rows = (
        EvalResult.objects.filter(eval__workspace=workspace, case__isnull=False)
        .select_related("eval")
        .order_by("case_id", "eval__version", "-id")
        .distinct("case_id", "eval__version")
    )
    table: dict[int, dict[int, EvalResult]] = {}
    for row in rows:
        assert row.case_id is not None
        table.setdefault(row.case_id, {})[row.eval.version] = row
    return table
