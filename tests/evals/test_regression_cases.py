"""Keeping a failed run as a regression case (issue 31 item 5): what a case records, that the
same run kept twice is one case, what cannot be kept, and who sees its words."""

from __future__ import annotations

from typing import Any

import pytest

from evals import cases
from evals.models import RegressionCase
from insights.models import FailureGroup
from runs import kernel
from runs.models import Finding
from tenancy.models import Wall
from tests.conftest import Team
from tests.evals.cases import FAILS_ALWAYS, FIXED_BY_V2, failed_run, scripted_agent
from tests.runs.driver import drive

pytestmark = pytest.mark.usefixtures("no_dispatch")


def test_it_keeps_the_input_version_kind_group_and_recorded_answers(team: Team) -> None:
    agent = scripted_agent(team)
    run = failed_run(team, agent, FAILS_ALWAYS)
    case, created = cases.keep(user=team.users["operator"], run_id=run.pk)
    assert created
    finding = Finding.objects.get(run_id=run.pk)
    assert (case.agent_name, case.source_version, case.kind, case.source_run_id) == (agent, 1, "not_found", run.pk)
    assert case.fingerprint == finding.fingerprint and case.error_key == finding.error_key
    assert case.input == {"issue": "SECRET-INPUT"}
    assert case.answers == FAILS_ALWAYS and case.model_route == "script"
    group = FailureGroup.objects.get(workspace_id=team.workspace.pk, fingerprint=finding.fingerprint)
    assert cases.document(team.users["operator"], case)["group"] == group.pk


def test_a_held_run_is_a_failed_run(team: Team) -> None:
    run = failed_run(team, scripted_agent(team), FIXED_BY_V2)
    assert run.status == "needs_attention"
    case, _ = cases.keep(user=team.users["operator"], run_id=run.pk)
    assert case.kind == "model" and case.error_key == "round_expansion_refused"


def test_keeping_the_same_run_twice_is_one_case(team: Team) -> None:
    run = failed_run(team, scripted_agent(team), FAILS_ALWAYS)
    first, created = cases.keep(user=team.users["operator"], run_id=run.pk)
    again, created_again = cases.keep(user=team.users["operator"], run_id=run.pk)
    assert created and not created_again and first.pk == again.pk
    assert RegressionCase.objects.filter(source_run_id=run.pk).count() == 1


def test_it_refuses_a_run_that_did_not_fail(team: Team) -> None:
    agent = scripted_agent(team)
    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={"agent": agent, "tasks": [{"key": "r1", "kind": "round", "model": "script", "script": [{"text": "ok"}]}]},
    )
    assert drive(run).status == "completed"
    with pytest.raises(kernel.Conflict) as refused:
        cases.keep(user=team.users["operator"], run_id=run.pk)
    assert refused.value.key == "not_failed"
    assert not RegressionCase.objects.exists()


def test_it_refuses_a_run_of_no_agent(team: Team) -> None:
    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={"tasks": [{"key": "f", "kind": "tool", "tool": "test.fail", "args": {}, "on_failure": "halt"}], "deliverable": "f"},
    )
    drive(run)
    with pytest.raises(kernel.Conflict) as refused:
        cases.keep(user=team.users["operator"], run_id=run.pk)
    assert refused.value.key == "not_an_agent_run"


@pytest.mark.parametrize(
    ("role", "error"), [("reader", kernel.Forbidden), ("viewer", kernel.Forbidden), ("outsider", kernel.NotFound)]
)
def test_only_an_operator_keeps_a_case(team: Team, role: str, error: Any) -> None:
    run = failed_run(team, scripted_agent(team), FAILS_ALWAYS)
    with pytest.raises(error):
        cases.keep(user=team.users[role], run_id=run.pk)
    assert not RegressionCase.objects.exists()


def test_a_real_providers_run_records_no_answers(team: Team) -> None:
    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={"agent": scripted_agent(team), "tasks": [{"key": "r1", "kind": "round", "model": "openai:gpt-4o-mini"}]},
    )
    answers, route = cases.recorded_answers(run)
    assert (answers, route) == (None, "openai:gpt-4o-mini")


@pytest.mark.spec("F11", "F12")
def test_a_viewer_a_walled_reader_and_another_members_private_case_show_no_words(team: Team) -> None:
    agent = scripted_agent(team)
    case, _ = cases.keep(user=team.users["operator"], run_id=failed_run(team, agent, FAILS_ALWAYS).pk)
    reader = cases.document(team.users["reader"], case)
    assert reader["content_visible"] and reader["input"] == {"issue": "SECRET-INPUT"} and reader["answers"] == FAILS_ALWAYS
    viewer = cases.document(team.users["viewer"], case)
    assert (viewer["content_visible"], viewer["input"], viewer["answers"]) == (False, None, None)
    assert viewer["kind"] == "not_found"
    wall = Wall.objects.create(workspace=team.workspace, agent_name=agent, created_by=team.users["operator"])
    wall.members.add(team.users["reader"])
    fresh_reader = type(team.users["reader"]).objects.get(pk=team.users["reader"].pk)  # walls are cached per request
    walled = cases.document(fresh_reader, case)
    assert (walled["content_visible"], walled["input"], walled["answers"]) == (False, None, None)
    private = failed_run(team, agent, FAILS_ALWAYS, private=True)
    kept, _ = cases.keep(user=team.users["operator"], run_id=private.pk)
    assert cases.document(team.users["operator"], kept)["input"] is not None  # its creator
    from tests.factories import make_member

    other_operator = make_member(workspace=team.workspace, role="operator")
    assert cases.document(other_operator, kept)["input"] is None


def test_deleting_a_case_needs_an_operator(team: Team) -> None:
    case, _ = cases.keep(user=team.users["operator"], run_id=failed_run(team, scripted_agent(team), FAILS_ALWAYS).pk)
    with pytest.raises(kernel.Forbidden):
        cases.delete(workspace=team.workspace, user=team.users["reader"], case_id=case.pk)
    cases.delete(workspace=team.workspace, user=team.users["operator"], case_id=case.pk)
    assert not RegressionCase.objects.exists()
    with pytest.raises(kernel.NotFound):
        cases.delete(workspace=team.workspace, user=team.users["operator"], case_id=case.pk)
