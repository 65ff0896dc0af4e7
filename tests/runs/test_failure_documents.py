"""A held run carries its failure, and every failed, timed-out or uncertain task carries one (F1,
F10, F11): the API and the console read the same mapping from runs.failures."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from runs import kernel
from runs.holds import held_runs
from runs.kernel import sweep_clocks
from runs.models import Run
from tests.conftest import Team
from tests.runs.driver import drive, echo, fail

TOOL_FAILED = {"kind": "tool_failed", "retryable": False, "partial": True, "person": False, "declared": False}


def create(team: Team, tasks: list[dict[str, Any]], deliverable: str) -> Run:
    run, _ = kernel.create_run(
        workspace=team.workspace, user=team.users["operator"], body={"tasks": tasks, "deliverable": deliverable}
    )
    return drive(run)


def tasks_of(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["key"]: t for t in doc["tasks"]}


@pytest.mark.spec("F1", "F10", "S13", "S21")
def test_it_gives_a_run_held_on_a_failure_that_failure_and_names_the_kinds_it_holds_on(team: Team) -> None:
    run = create(
        team, [fail("a", on_failure="halt"), fail("b", on_failure="halt", error="tool_timeout"), echo("c", after=["a"])], "c"
    )
    status, doc = team.api("reader").get(f"/runs/{run.pk}")
    assert status == 200 and doc["status"] == "needs_attention"
    assert doc["attention"] == {"reason": "halt_failure", "blocked_task_keys": ["a", "b"], "kinds": ["tool_failed", "timeout"]}
    assert doc["failure"] == {**TOOL_FAILED, "message": "a failed"}
    tasks = tasks_of(doc)
    assert tasks["a"]["failure"] == {**TOOL_FAILED, "message": "a failed"}
    assert tasks["b"]["failure"]["kind"] == "timeout" and tasks["b"]["failure"]["retryable"] is True
    assert tasks["c"]["failure"] is None


@pytest.mark.spec("F11")
def test_it_keeps_the_words_of_a_held_failure_from_a_closed_reader(team: Team) -> None:
    run = create(team, [fail("a", on_failure="halt")], "a")
    status, doc = team.api("viewer").get(f"/runs/{run.pk}")
    assert status == 200
    assert doc["failure"] == {**TOOL_FAILED, "message": None}
    assert tasks_of(doc)["a"]["failure"] == {**TOOL_FAILED, "message": None}
    assert "a failed" not in str(doc)


@pytest.mark.spec("F1", "S18")
def test_it_names_the_failure_behind_an_unresolved_deliverable(team: Team) -> None:
    run = create(team, [fail("a"), echo("b", after=["a"])], "b")
    assert run.attention == {"reason": "deliverable_unresolved", "blocked_task_keys": ["b"], "kinds": ["tool_failed"]}
    assert run.failure == {**TOOL_FAILED, "message": "a failed"}


def test_it_holds_with_no_failure_when_none_is_behind_the_hold(team: Team) -> None:
    run, receipt = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={"tasks": [{"key": "q", "kind": "await", "question": "?", "timeout_s": 5}, echo("e")], "deliverable": "e"},
    )
    run = drive(run)
    assert run.status == "running"
    assert run.failure is None


@pytest.mark.spec("F10", "S14")
def test_it_drops_the_failure_when_the_hold_is_released(team: Team) -> None:
    run = create(team, [fail("a", on_failure="halt"), echo("b")], "b")
    assert run.failure is not None
    run = kernel.retry(run_id=run.pk, key="a", user=team.users["operator"])
    assert run.status == "running" and run.failure is None


@pytest.mark.spec("F1", "S6", "S10")
def test_it_gives_timed_out_and_uncertain_tasks_their_kinds(team: Team) -> None:
    from django.conf import settings

    from runs.kernel import sweep_expired_claims
    from tests.runs.driver import task

    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={
            "tasks": [
                {"key": "q", "kind": "await", "question": "?", "timeout_s": 5, "on_failure": "halt"},
                {"key": "pay", "kind": "tool", "tool": "test.effect", "args": {"id": "x"}},
            ]
        },
    )
    assert kernel.claim_task(None, task(run, "pay").pk, "dies") is not None
    later = timezone.now() + timedelta(seconds=settings.OZ0_LEASE_SECONDS + 6)
    sweep_clocks(later)
    sweep_expired_claims(later)
    status, doc = team.api("reader").get(f"/runs/{run.pk}")
    tasks = tasks_of(doc)
    assert tasks["q"]["failure"] == {
        "kind": "timeout",
        "retryable": True,
        "partial": True,
        "person": False,
        "declared": False,
        "message": "nobody answered in time",
    }
    assert tasks["pay"]["failure"]["kind"] == "unknown_outcome" and tasks["pay"]["failure"]["person"] is True
    assert doc["attention"]["kinds"] == ["timeout", "unknown_outcome"]


@pytest.mark.spec("F10", "F11")
def test_it_shows_the_console_the_same_failure_as_the_api(team: Team) -> None:
    run = create(team, [fail("a", on_failure="halt")], "a")
    _, doc = team.api("reader").get(f"/runs/{run.pk}")
    hold = held_runs(team.users["reader"], team.workspace)[0]
    assert hold["kinds"] == ["tool_failed"]
    assert hold["failed"][0]["failure"] == tasks_of(doc)["a"]["failure"]
    client = Client()
    client.force_login(team.users["reader"])
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="run-attention"' in page and 'id="run-failure"' in page
    assert page.count('title="failure kind">tool_failed<') >= 2  # the held run and its task
    holds = client.get(f"/w/{team.slug}/holds/").content.decode()
    assert "holds on" in holds and "tool_failed" in holds
