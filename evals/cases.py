"""Regression cases: keep a failed run as one (operators), read them (every member, words by the
run's rule), delete one (operators).

A case is a failed run of an agent: one that has a finding (runs.kernel writes one when the run
first holds on a failure, or ends canceled). Keeping the same run twice returns the case kept the
first time. A case keeps the run's words (its input and the script answers), so it shows them by
the run's own rule, `runs.permissions.can_read_content`, applied to the privacy, creator, agent
and workspace it copied: a viewer, a walled member or someone else than the creator of a private
run sees the kind, the error key, the group and the versions, never the words.
"""

from __future__ import annotations

from typing import Any, cast

from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from evals.models import RegressionCase
from insights.models import FailureGroup
from runs import selectors
from runs.kernel import Conflict, Forbidden, NotFound
from runs.models import Finding, Run, Task
from runs.permissions import can_read_content
from tenancy.models import Workspace
from tenancy.permissions import has_write_standing

CASES_MAX = 1000
ID_MAX = 2**63 - 1
SCRIPT_PROVIDER = "script"


def content_visible(user: Any, case: RegressionCase) -> bool:
    """The run's rule on the case's copy of what it reads: role, privacy and creator, walls (F11, F12)."""
    # can_read_content reads workspace_id, private, created_by_id and agent_name: the case has each,
    # copied from its run, so the one rule decides for the copy as it did for the run.
    return can_read_content(user, cast(Run, case))


def recorded_answers(run: Run) -> tuple[Any, str]:
    """The `script` provider's answers the run's first model round had, and that round's route
    (None when its model was a real provider, or the run had no round)."""
    spec = Task.objects.filter(run=run, kind="round").order_by("position").values_list("spec", flat=True).first()
    if not isinstance(spec, dict):
        return None, ""
    route = str(spec.get("model") or SCRIPT_PROVIDER)
    routes = [route, *(str(r) for r in spec.get("fallback_models") or [])]
    scripted = all(r.split(":", 1)[0] == SCRIPT_PROVIDER for r in routes)
    return (spec.get("script") if scripted and "script" in spec else None), route[:200]


def keep(*, user: Any, run_id: Any) -> tuple[RegressionCase, bool]:
    """Keep a failed run as a regression case of its agent; (case, created). The same run kept
    again returns its case. Needs write standing in the run's workspace."""
    run = selectors.run_for(user, run_id)
    if not has_write_standing(user, run.workspace_id):
        raise Forbidden()
    if run.agent_version is None:
        raise Conflict(
            "not_an_agent_run", "only a run of an agent becomes a regression case (it is checked against the agent's versions)"
        )
    finding = Finding.objects.filter(run_id=run.pk).order_by("pk").first()
    if finding is None:
        raise Conflict("not_failed", f"the run is {run.status} and has not failed: only a failed run becomes a regression case")
    existing = RegressionCase.objects.filter(workspace_id=run.workspace_id, source_run_id=run.pk).first()
    if existing is not None:
        return existing, False
    if RegressionCase.objects.filter(workspace_id=run.workspace_id).count() >= CASES_MAX:
        raise Conflict("too_many_cases", f"a workspace keeps at most {CASES_MAX} regression cases: delete some first")
    answers, route = recorded_answers(run)
    try:
        with transaction.atomic():
            case = RegressionCase.objects.create(
                workspace_id=run.workspace_id,
                agent_name=run.agent_name,
                source_run_id=run.pk,
                source_version=run.agent_version.version,
                kind=finding.kind,
                error_key=finding.error_key,
                fingerprint=finding.fingerprint,
                input=run.input,
                answers=answers,
                model_route=route,
                private=run.private,
                created_by_id=run.created_by_id,
                kept_by=user if getattr(user, "is_authenticated", False) else None,
            )
    except IntegrityError:  # kept by someone else in the meantime: theirs is the case
        return RegressionCase.objects.get(workspace_id=run.workspace_id, source_run_id=run.pk), False
    return case, True


def cases_of(workspace: Workspace, agent: str | None = None) -> QuerySet[RegressionCase]:
    rows = RegressionCase.objects.filter(workspace=workspace).select_related("kept_by")
    if agent is not None:
        rows = rows.filter(agent_name=agent)
    return rows.order_by("agent_name", "-id")


def case_for(workspace: Workspace, case_id: int) -> RegressionCase:
    case = RegressionCase.objects.filter(workspace=workspace, pk=case_id).first() if 0 < case_id <= ID_MAX else None
    if case is None:
        raise NotFound("regression case")
    return case


def delete(*, workspace: Workspace, user: Any, case_id: int) -> None:
    """Delete a case (write standing); the evals that ran it keep their results."""
    if not has_write_standing(user, workspace.pk):
        raise Forbidden()
    case_for(workspace, case_id).delete()


def group_ids(cases: list[RegressionCase]) -> dict[tuple[int, str], int]:
    """The failure group of each case, by (workspace, fingerprint): one query for a page of cases."""
    prints = {c.fingerprint for c in cases if c.fingerprint}
    if not prints:
        return {}
    workspaces = {c.workspace_id for c in cases}
    rows = FailureGroup.objects.filter(workspace_id__in=workspaces, fingerprint__in=prints)
    return {(w, f): pk for pk, w, f in rows.values_list("pk", "workspace_id", "fingerprint")}


def document(user: Any, case: RegressionCase, *, groups: dict[tuple[int, str], int] | None = None) -> dict[str, Any]:
    """A case as the API shows it: its words (input, recorded answers) only to those who may read them."""
    content = content_visible(user, case)
    groups = groups if groups is not None else group_ids([case])
    return {
        "id": case.pk,
        "agent": case.agent_name,
        "source_run": str(case.source_run_id),
        "source_version": case.source_version,
        "kind": case.kind,
        "error_key": case.error_key or None,
        "group": groups.get((case.workspace_id, case.fingerprint)),
        "model_route": case.model_route or None,
        "replayable": case.answers is not None,
        "private": case.private,
        "content_visible": content,
        "input": case.input if content else None,
        "answers": case.answers if content else None,
        "kept_by": case.kept_by.get_username() if case.kept_by else None,
        "kept_at": case.kept_at.isoformat(),
    }
