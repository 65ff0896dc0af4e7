"""Evals end to end with the script provider (issue 31 item 5): a failed run's case replays its
model's answers on another version; one case now passes, one still fails; the runs are real runs
of the version, marked `eval`; held runs are canceled once their outcome is recorded."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from evals import cases, running
from evals.models import Eval, EvalResult
from oz0agents.registry import register
from runs import kernel
from runs.models import Run
from tests.conftest import Team
from tests.evals.cases import (
    FAILS_ALWAYS,
    FIXED_BY_V2,
    drive_eval_runs,
    failed_run,
    register_version,
    scripted_agent,
)

pytestmark = pytest.mark.usefixtures("no_dispatch")


def two_cases(team: Team) -> tuple[str, int, int]:
    agent = scripted_agent(team)
    fixed = failed_run(team, agent, FIXED_BY_V2)
    still = failed_run(team, agent, FAILS_ALWAYS)
    register_version(team, agent, "oz.fail, test.echo")
    operator = team.users["operator"]
    return agent, cases.keep(user=operator, run_id=fixed.pk)[0].pk, cases.keep(user=operator, run_id=still.pk)[0].pk


def test_one_case_now_passes_and_one_still_fails_on_the_fixed_version(team: Team) -> None:
    agent, fixed, still = two_cases(team)
    evaluation = running.start(workspace=team.workspace, user=team.users["operator"], body={"agent": agent, "version": 2})
    assert running.document(evaluation)["counts"] == {"cases": 2, "passed": 0, "failed": 0, "pending": 2, "no_verdict": 0}
    drive_eval_runs(evaluation)
    doc = running.document(running.refresh(evaluation))
    by_case = {r["case"]: r for r in doc["results"]}
    assert (by_case[fixed]["kind_before"], by_case[fixed]["outcome"], by_case[fixed]["verdict"]) == (
        "model",
        "completed",
        "passed",
    )
    assert by_case[fixed]["passed"] is True and by_case[fixed]["replayed"]
    assert (by_case[still]["kind_before"], by_case[still]["kind_after"], by_case[still]["verdict"]) == (
        "not_found",
        "not_found",
        "failed_again",
    )
    assert by_case[still]["passed"] is False
    assert doc["counts"] == {"cases": 2, "passed": 1, "failed": 1, "pending": 0, "no_verdict": 0}
    assert doc["finished_at"] is not None


def test_each_case_is_a_real_run_of_the_chosen_version_marked_eval(team: Team) -> None:
    agent, *_ = two_cases(team)
    evaluation = running.start(workspace=team.workspace, user=team.users["operator"], body={"agent": agent, "version": 1})
    runs = Run.objects.filter(pk__in=evaluation.results.values("run_id"))
    assert runs.count() == 2
    # v2 serves new runs; the eval pinned v1, and marked its runs with the arm `eval`.
    assert {(r.agent_version.version, r.rollout, r.workspace_id) for r in runs} == {(1, "eval", team.workspace.pk)}
    assert {r.created_by_id for r in runs} == {team.users["operator"].pk}


def test_a_held_run_is_recorded_as_failed_and_then_canceled(team: Team) -> None:
    agent, fixed, _ = two_cases(team)
    evaluation = running.start(workspace=team.workspace, user=team.users["operator"], body={"agent": agent, "version": 1})
    drive_eval_runs(evaluation)
    result = EvalResult.objects.get(eval=evaluation, case_number=fixed)
    assert result.run is not None and result.run.status == "needs_attention"
    running.refresh(evaluation)
    result.refresh_from_db()
    assert (result.outcome, result.kind_after, result.verdict) == ("failed", "model", "failed_again")
    assert Run.objects.get(pk=result.run_id).status == "canceled"
    assert running.document(evaluation)["counts"]["failed"] == 2


def test_a_run_that_fails_another_way_passes_but_says_so(team: Team) -> None:
    agent = scripted_agent(team)
    case, _ = cases.keep(user=team.users["operator"], run_id=failed_run(team, agent, FIXED_BY_V2).pk)
    # v2 lists test.echo: the echo now runs, and then the model fails another way.
    register_version(team, agent, "oz.fail, test.echo")
    case.answers = [FIXED_BY_V2[0], FAILS_ALWAYS[0]]
    case.save()
    evaluation = running.start(workspace=team.workspace, user=team.users["operator"], body={"agent": agent, "version": 2})
    drive_eval_runs(evaluation)
    (result,) = running.document(running.refresh(evaluation))["results"]
    assert (result["kind_before"], result["kind_after"], result["verdict"], result["passed"]) == (
        "model",
        "not_found",
        "passed_other_failure",
        True,
    )


def test_a_version_with_its_own_script_is_run_with_it(team: Team) -> None:
    agent, *_ = two_cases(team)
    register(
        f"name: {agent}\nmodel: script\ninstructions: Triage.\ntools: [oz.fail]\napproval: {{mode: bypass}}\n"
        "script:\n  - text: fixed for every input\n",
        workspace=team.workspace,
    )
    evaluation = running.start(workspace=team.workspace, user=team.users["operator"], body={"agent": agent, "version": 3})
    drive_eval_runs(evaluation)
    doc = running.document(running.refresh(evaluation))
    assert {(r["replayed"], r["verdict"]) for r in doc["results"]} == {(False, "passed")}


def test_a_canceled_run_has_no_verdict(team: Team) -> None:
    agent, *_ = two_cases(team)
    evaluation = running.start(workspace=team.workspace, user=team.users["operator"], body={"agent": agent, "version": 2})
    for result in evaluation.results.all():
        kernel.cancel_run(run_id=result.run_id, user=team.users["operator"], reason="not today")
    doc = running.document(running.refresh(evaluation))
    assert {(r["outcome"], r["verdict"], r["passed"]) for r in doc["results"]} == {("canceled", "none", None)}
    assert doc["counts"]["no_verdict"] == 2


def test_another_members_private_case_is_skipped(team: Team) -> None:
    agent = scripted_agent(team)
    from tests.factories import make_member

    other = make_member(workspace=team.workspace, role="operator")
    team.users["other"] = other
    private = failed_run(team, agent, FAILS_ALWAYS, user="other", private=True)
    cases.keep(user=team.users["operator"], run_id=private.pk)
    evaluation = running.start(workspace=team.workspace, user=team.users["operator"], body={"agent": agent, "version": 1})
    (result,) = running.document(evaluation)["results"]
    assert (result["outcome"], result["reason"], result["run"]) == ("skipped", "private_case", None)
    mine = running.start(workspace=team.workspace, user=other, body={"agent": agent, "version": 1})
    (own,) = running.document(mine)["results"]
    assert own["outcome"] == "pending" and Run.objects.get(pk=own["run"]).private


@pytest.mark.parametrize(
    ("body", "error", "key"),
    [
        ({"agent": "Not A Name", "version": 1}, kernel.InvalidRequest, "invalid_agent"),
        ({"agent": "x", "version": 0}, kernel.InvalidRequest, "invalid_version"),
        ({"agent": "x", "version": True}, kernel.InvalidRequest, "invalid_version"),
        ({"agent": "x", "version": 1, "more": 1}, kernel.InvalidRequest, "unknown_field"),
        ({"agent": "nobody", "version": 1}, kernel.NotFound, "not_found"),
    ],
)
def test_it_refuses_a_bad_start_and_starts_nothing(team: Team, body: dict[str, Any], error: Any, key: str) -> None:
    with pytest.raises(error) as refused:
        running.start(workspace=team.workspace, user=team.users["operator"], body=body)
    assert refused.value.key == key
    assert not Eval.objects.exists()


def test_it_refuses_an_agent_without_cases_or_without_the_version(team: Team) -> None:
    agent = scripted_agent(team)
    with pytest.raises(kernel.Conflict):
        running.start(workspace=team.workspace, user=team.users["operator"], body={"agent": agent, "version": 1})
    with pytest.raises(kernel.NotFound):
        running.start(workspace=team.workspace, user=team.users["operator"], body={"agent": agent, "version": 9})
    with pytest.raises(kernel.Forbidden):
        running.start(workspace=team.workspace, user=team.users["reader"], body={"agent": agent, "version": 1})


def test_the_command_prints_each_cases_kind_before_and_after(team: Team, monkeypatch: pytest.MonkeyPatch) -> None:
    agent, fixed, still = two_cases(team)

    def wait(evaluation: Eval, *, timeout: float, interval: float = 1.0) -> Eval:
        drive_eval_runs(evaluation)  # the workers' part, in-process
        return running.refresh(evaluation)

    monkeypatch.setattr(running, "wait", wait)
    out = StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("eval_run", agent, "--version", "2", "--workspace", team.slug, "--wait", stdout=out)
    assert exited.value.code == 1  # a case failed again
    text = out.getvalue()
    assert f"{agent} v2 in {team.slug}, 2 case(s), by kernel" in text
    # A case's row starts with its id; the summary ("1 passed, 1 failed, ...") starts with a count,
    # which equals a case's id on a fresh database.
    summary = "1 passed, 1 failed, 0 pending, 0 without a verdict"
    rows = [line for line in text.splitlines() if line.split() and line.split()[0].isdigit() and line.strip() != summary]
    lines = {line.split()[0]: line for line in rows}
    assert lines[str(fixed)].split()[:5] == [str(fixed), "model", "completed", "completed", "passed"]
    assert lines[str(still)].split()[:5] == [str(still), "not_found", "not_found", "failed", "FAILED"]
    assert summary in text.splitlines()


def test_the_command_without_wait_starts_the_runs_and_says_where_to_follow(team: Team) -> None:
    agent, *_ = two_cases(team)
    out = StringIO()
    call_command("eval_run", agent, "--version", "2", stdout=out)
    assert "2 pending" in out.getvalue() and f"/api/v1/workspaces/{team.slug}/evals/" in out.getvalue()
    assert Run.objects.filter(rollout="eval").count() == 2


def test_the_command_refuses_an_unknown_agent(team: Team) -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="no agent named"):
        call_command("eval_run", "nobody-here", "--version", "1", stdout=StringIO())
