"""F18: a run counts as failed, by kind, when it first holds on a failure or ends canceled with one;
a repaired hold counts as a repair; the rollups stay exact, one count per run, whatever its holds."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db.models import Sum

from insights.models import FailureTotal
from runs.models import Finding, Run
from tests.insights.planting import make_agent
from tests.runs.driver import drive

pytestmark = pytest.mark.django_db


def card(team: Any, agent: str) -> dict[str, Any]:
    status, body = team.api("viewer").get(f"/insights/agents/{agent}")
    assert status == 200, body
    return {
        "runs": body["runs"],
        "failed": body["failed"],
        "by_kind": {row["kind"]: row["failed"] for row in body["by_kind"]},
        "retried": body["repairs"]["retried"],
        "abandoned": body["repairs"]["abandoned"],
        "after_hold": body["repairs"]["after_hold"],
    }


@pytest.mark.spec("F18")
def test_it_counts_a_held_run_once_through_hold_repair_hold_and_cancel(team: Any) -> None:
    make_agent("mended", workspace=team.workspace)
    flaky = {"key": "a", "kind": "tool", "tool": "test.flaky", "args": {"fail_times": 1, "id": uuid.uuid4().hex}}
    late = {"key": "b", "kind": "tool", "tool": "test.fail", "args": {"error": "tool_timeout"}, "after": ["a"]}
    status, doc = team.api("operator").post(
        f"/workspaces/{team.slug}/runs",
        {"agent": "mended", "tasks": [{**flaky, "on_failure": "halt"}, {**late, "on_failure": "halt"}], "deliverable": "b"},
    )
    assert status == 201, doc
    run = drive(Run.objects.get(pk=doc["run"]["id"]))
    assert run.status == "needs_attention"
    # Held on its first failure: failed, by that failure's kind.
    first = {"runs": 1, "failed": 1, "by_kind": {"tool_failed": 1}, "retried": 0, "abandoned": 0, "after_hold": 0}
    assert card(team, "mended") == first

    status, doc = team.api("operator").post(f"/runs/{run.pk}/tasks/a/retry")
    assert status == 200, doc
    # The repair counts as a repair of a hold; the run is not counted twice.
    repaired = {**first, "retried": 1, "after_hold": 1}
    assert card(team, "mended") == repaired

    run = drive(run)
    assert run.status == "needs_attention" and run.attention["blocked_task_keys"] == ["b"]
    # A second hold of the same run: still one failed run, of the kind it first failed with.
    assert card(team, "mended") == repaired

    status, doc = team.api("operator").post(f"/runs/{run.pk}/cancel", {"reason": "giving up"})
    assert status == 200 and doc["run"]["status"] == "canceled"
    assert doc["run"]["failure"]["kind"] == "timeout"  # the run's own failure: the hold it ended on
    assert card(team, "mended") == repaired
    assert Finding.objects.filter(run_id=run.pk).count() == 1
    assert FailureTotal.objects.filter(agent_name="mended").aggregate(n=Sum("failed"))["n"] == 1


@pytest.mark.spec("F18")
def test_it_counts_a_run_canceled_without_a_hold_when_it_ends(team: Any) -> None:
    make_agent("stopped", workspace=team.workspace)
    status, doc = team.api("operator").post(
        f"/workspaces/{team.slug}/runs", {"agent": "stopped", "tasks": [{"key": "q", "kind": "await", "question": "?"}]}
    )
    assert status == 201
    assert card(team, "stopped")["failed"] == 0
    status, doc = team.api("operator").post(f"/runs/{doc['run']['id']}/cancel", {"reason": "not needed"})
    assert status == 200
    assert card(team, "stopped") == {
        "runs": 1,
        "failed": 1,
        "by_kind": {"cancelled": 1},
        "retried": 0,
        "abandoned": 0,
        "after_hold": 0,
    }


@pytest.mark.spec("F18")
def test_it_counts_a_hold_with_no_failure_behind_it_only_when_the_run_is_canceled(team: Any) -> None:
    make_agent("raced", workspace=team.workspace)
    tasks = [
        {"key": "fast", "kind": "tool", "tool": "test.echo", "args": {"value": 1}},
        {"key": "gate", "kind": "await", "question": "?"},
        {"key": "slow", "kind": "tool", "tool": "test.echo", "args": {"value": 2}, "after": ["gate"]},
        {"key": "j", "kind": "join", "mode": "any", "after": ["fast", "slow"]},
    ]
    status, doc = team.api("operator").post(
        f"/workspaces/{team.slug}/runs", {"agent": "raced", "tasks": tasks, "deliverable": "slow"}
    )
    assert status == 201
    run = drive(Run.objects.get(pk=doc["run"]["id"]))
    # The race canceled the deliverable: the run holds, but on no failure.
    assert run.status == "needs_attention" and run.attention == {
        "reason": "deliverable_unresolved",
        "blocked_task_keys": ["slow"],
        "kinds": [],
    }
    assert run.failure is None
    assert card(team, "raced")["failed"] == 0
    status, doc = team.api("operator").post(f"/runs/{run.pk}/cancel", {"reason": "wrong deliverable"})
    assert status == 200
    assert card(team, "raced")["by_kind"] == {"cancelled": 1}
