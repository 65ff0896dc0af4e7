"""Canary rollouts (issue 33 item 4): a version registered as a canary takes a share of new runs,
chosen by a hash of the run's id and recorded on the run; promote and roll back in one action
(operators, audited); the sweep rolls back a canary that fails more than the stable version by
the margin over a minimum of runs, with a digest to the workspace's rollback subscribers."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from insights import canary
from notify import digests, subscriptions
from oz0agents.assignment import assign, bucket
from oz0agents.models import Agent, AgentVersion, RolloutEvent
from oz0agents.registry import register
from runs import kernel
from runs.models import Run, RunStatus
from tests.conftest import Team
from tests.factories import unique

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch")]


def manifest(name: str, text: str) -> str:
    return f"name: {name}\nmodel: script\nscript:\n  - text: {text}\n"


def rolling(team: Team, percent: int = 10) -> Agent:
    """An agent with v1 stable and v2 a canary on `percent` of new runs."""
    name = unique("agent")
    register(manifest(name, "one"), team.users["operator"], workspace=team.workspace)
    register(manifest(name, "two"), team.users["operator"], workspace=team.workspace, canary=percent)
    return Agent.objects.select_related("stable_version", "canary_version").get(workspace=team.workspace, name=name)


def runs_of(agent: Agent, arm: str, *, completed: int = 0, failed: int = 0, kind: str = "not_found") -> None:
    """Runs of one arm, decided as told (the rollout counts what runs record, whoever wrote it)."""
    version = agent.canary_version if arm == "canary" else agent.stable_version
    for i in range(completed + failed):
        Run.objects.create(
            workspace_id=agent.workspace_id,
            agent_version=version,
            agent_name=agent.name,
            rollout=arm,
            status=RunStatus.COMPLETED if i < completed else RunStatus.NEEDS_ATTENTION,
            failure=None if i < completed else {"kind": kind, "message": "gone"},
        )


def test_the_bucket_is_a_deterministic_uniform_hash_of_the_run_id() -> None:
    ids = [uuid.UUID(int=i * 7919 + 1) for i in range(2000)]
    assert [bucket(i) for i in ids] == [bucket(str(i)) for i in ids]  # the same id, the same arm
    assert all(0 <= bucket(i) < 100 for i in ids)
    share = sum(bucket(i) < 10 for i in ids) / len(ids)
    assert 0.07 < share < 0.13, share


def test_a_canary_takes_its_share_of_new_runs_by_their_id_and_the_run_records_its_arm(team: Team) -> None:
    agent = rolling(team, percent=30)
    assert (agent.stable_version.version, agent.canary_version.version, agent.canary_percent) == (1, 2, 30)  # type: ignore[union-attr]
    made = [
        kernel.create_run(workspace=team.workspace, user=team.users["operator"], body={"agent": agent.name})[0] for _ in range(30)
    ]
    for run in made:
        canary = bucket(run.pk) < 30
        assert (run.rollout, run.agent_version.version) == (("canary", 2) if canary else ("stable", 1))  # type: ignore[union-attr]
    assert {r.rollout for r in made} == {"canary", "stable"}
    detail = team.api("viewer").get(f"/workspaces/{team.slug}/agents/{agent.name}")[1]
    assert (detail["serving_version"], detail["canary"]["version"], detail["canary"]["percent"]) == (1, 2, 30)
    # The choice is the hash's: the same id is always assigned the same way.
    some = made[0].pk
    assert assign(agent, some).arm == made[0].rollout
    doc = team.api("viewer").get(f"/runs/{made[0].pk}")[1]
    assert doc["rollout"] == made[0].rollout


def test_registering_without_a_canary_serves_the_new_version_to_every_run_and_ends_the_canary(team: Team) -> None:
    agent = rolling(team, percent=50)
    register(manifest(agent.name, "three"), team.users["operator"], workspace=team.workspace)
    agent.refresh_from_db()
    assert (agent.canary_version_id, agent.stable_version_id) == (None, None)
    run, _ = kernel.create_run(workspace=team.workspace, user=team.users["operator"], body={"agent": agent.name})
    assert (run.agent_version.version, run.rollout) == (3, "")  # type: ignore[union-attr]
    assert list(RolloutEvent.objects.filter(agent=agent).order_by("id").values_list("verb", flat=True)) == [
        "canary_started",
        "superseded",
    ]


def test_the_api_registers_a_canary_and_refuses_a_bad_share_writing_nothing(team: Team) -> None:
    name = unique("agent")
    api = team.api("operator")
    status, body = api.post(f"/workspaces/{team.slug}/agents", {"manifest": manifest(name, "one")})
    assert status == 201 and body["canary"] is None
    for bad in (0, 100, -5, "10", 10.5, True, [10], {"p": 10}, 10**30):
        status, answer = api.post(f"/workspaces/{team.slug}/agents", {"manifest": manifest(name, "two"), "canary": bad})
        assert 400 <= status < 500 and status != 404, (bad, status, answer)
        assert "error" in answer or "detail" in answer, answer
    assert AgentVersion.objects.filter(agent__name=name).count() == 1
    status, body = api.post(f"/workspaces/{team.slug}/agents", {"manifest": manifest(name, "two"), "canary": 10})
    assert status == 201 and (body["version"], body["canary"]) == (2, 10)
    event = RolloutEvent.objects.get(agent_name=name)
    assert (event.verb, event.actor, event.canary_version, event.stable_version, event.data) == (
        "canary_started",
        team.users["operator"].username,
        2,
        1,
        {"percent": 10},
    )


@pytest.mark.parametrize("verb", ["promote", "rollback"])
def test_promote_and_roll_back_are_for_operators_and_leave_an_audit_row(team: Team, verb: str) -> None:
    agent = rolling(team)
    path = f"/workspaces/{team.slug}/agents/{agent.name}/rollout/{verb}"
    for role, expected in (("outsider", 404), ("viewer", 403), ("reader", 403)):
        status, body = team.api(role).post(path)
        assert status == expected, (role, status, body)
    agent.refresh_from_db()
    assert agent.canary_version_id is not None  # nothing changed
    assert not RolloutEvent.objects.filter(agent=agent, verb__in=("promoted", "rolled_back")).exists()
    status, body = team.api("operator").post(path)
    assert status == 200, body
    assert body["canary"] is None and body["stable_version"] == (2 if verb == "promote" else 1)
    event = RolloutEvent.objects.filter(agent=agent).latest("id")
    assert (event.verb, event.actor, event.canary_version, event.stable_version) == (
        "promoted" if verb == "promote" else "rolled_back",
        team.users["operator"].username,
        2,
        1,
    )
    assert body["events"][0]["verb"] == event.verb
    detail = team.api("viewer").get(f"/workspaces/{team.slug}/agents/{agent.name}")[1]
    assert (detail["version"], detail["serving_version"], detail["canary"]) == (2, 2 if verb == "promote" else 1, None)
    run, _ = kernel.create_run(workspace=team.workspace, user=team.users["operator"], body={"agent": agent.name})
    assert (run.agent_version.version, run.rollout) == (2 if verb == "promote" else 1, "")  # type: ignore[union-attr]
    # Again: there is no canary any more.
    status, body = team.api("operator").post(path)
    assert status == 409 and body["error"]["key"] == "no_canary"


def test_the_rollout_document_shows_both_arms_side_by_side_for_a_viewer(team: Team, settings: Any) -> None:
    settings.OZ0_CANARY_MIN_RUNS = 5
    agent = rolling(team)
    runs_of(agent, "canary", completed=2, failed=2, kind="not_found")
    runs_of(agent, "stable", completed=9, failed=1, kind="timeout")
    status, body = team.api("viewer").get(f"/workspaces/{team.slug}/agents/{agent.name}/rollout")
    assert status == 200, body
    canary, stable = body["canary"]["arms"]["canary"], body["canary"]["arms"]["stable"]
    assert (canary["version"], canary["runs"], canary["failed"], canary["failure_rate"]) == (2, 4, 2, 0.5)
    assert canary["kinds"] == [{"kind": "not_found", "failed": 2}]
    assert (stable["version"], stable["runs"], stable["failed"], stable["failure_rate"]) == (1, 10, 1, 0.1)
    low, high = canary["interval"]
    assert low < 0.5 < high
    assert body["canary"]["breach"] is False  # the canary has fewer than 5 decided runs
    assert team.api("outsider").get(f"/workspaces/{team.slug}/agents/{agent.name}/rollout")[0] == 404


def test_the_sweep_rolls_back_a_canary_failing_past_the_margin_once_with_a_notification(team: Team, settings: Any) -> None:
    settings.OZ0_CANARY_MIN_RUNS, settings.OZ0_CANARY_MARGIN = 5, 0.10
    agent = rolling(team)
    operator = team.users["operator"]
    operator.email = "operator@example.test"
    operator.save(update_fields=["email"])
    sub, _ = subscriptions.create(operator, {"workspace": team.slug, "kinds": ["rollback"], "email": True})
    runs_of(agent, "canary", completed=2, failed=2)
    runs_of(agent, "stable", completed=10)
    assert canary.sweep() == []  # four decided canary runs: under the minimum
    runs_of(agent, "canary", completed=0, failed=1)  # 3 of 5 failed, the stable version 0 of 10
    [event] = canary.sweep()
    assert canary.sweep() == []  # rolled back once
    agent.refresh_from_db()
    assert (agent.canary_version_id, agent.stable_version.version) == (None, 1)  # type: ignore[union-attr]
    assert (event.verb, event.actor, event.canary_version, event.stable_version) == ("auto_rolled_back", "oz0", 2, 1)
    assert (event.data["canary_arm"]["failed"], event.data["stable_arm"]["failed"]) == (3, 0)
    run, _ = kernel.create_run(workspace=team.workspace, user=operator, body={"agent": agent.name})
    assert run.agent_version.version == 1  # type: ignore[union-attr]

    waits, total = digests.waits_for(sub, after=sub.watermark, until=timezone.now() + timedelta(seconds=1))
    assert total == 1 and waits[0].kind == "rollback"
    subject, text = digests.compose(sub, waits, total, timezone.now())
    assert f"/w/{team.slug}/agents/{agent.name}/" in text
    assert "canary v2 rolled back to v1: failed 3 of 5 runs, the stable version 0 of 10" in text


def test_the_sweep_keeps_a_canary_within_the_margin(team: Team, settings: Any) -> None:
    settings.OZ0_CANARY_MIN_RUNS, settings.OZ0_CANARY_MARGIN = 5, 0.25
    agent = rolling(team)
    runs_of(agent, "canary", completed=8, failed=2)  # 20 %
    runs_of(agent, "stable", completed=9, failed=1)  # 10 %: within 25 points
    assert canary.sweep() == []
    agent.refresh_from_db()
    assert agent.canary_version_id is not None


def test_a_rollback_subscription_is_a_kind_people_may_ask_for(team: Team) -> None:
    row, _ = subscriptions.create(
        team.users["viewer"],
        {"workspace": team.slug, "kinds": ["hold", "rollback"], "webhook_url": "https://hooks.example.com/x"},
    )
    assert row.kinds == ["hold", "rollback"]
