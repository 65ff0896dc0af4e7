"""Retention of schedules' firings and triggers' deliveries: past their workspace's retention they
go, in batches; younger ones and a workspace that keeps for ever keep theirs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from schedules import retention
from schedules.models import Firing, Schedule, Trigger, TriggerDelivery
from tests.conftest import Team

pytestmark = pytest.mark.django_db


def rows(team: Team, days_ago: list[int]) -> tuple[Schedule, Trigger]:
    now = timezone.now()
    schedule = Schedule.objects.create(
        workspace=team.workspace,
        name=f"s{team.workspace.pk}",
        owner=team.users["operator"],
        body={"agent": "x"},
        interval_seconds=3600,
        next_fire_at=now,
        anchor_at=now,
    )
    trigger = Trigger.objects.create(
        workspace=team.workspace,
        name=f"t{team.workspace.pk}",
        public_id=f"p{team.workspace.pk:031d}",
        owner=team.users["operator"],
        body={"agent": "x"},
        idempotency={"header": "X-Id"},
        secret_salt="s",
    )
    for index, days in enumerate(days_ago):
        firing = Firing.objects.create(schedule=schedule, due_at=now, outcome="started")
        Firing.objects.filter(pk=firing.pk).update(fired_at=now - timedelta(days=days))
        delivery = TriggerDelivery.objects.create(trigger=trigger, key=f"k{index}")
        TriggerDelivery.objects.filter(pk=delivery.pk).update(received_at=now - timedelta(days=days))
    return schedule, trigger


def test_firings_and_deliveries_past_the_retention_go_in_batches_and_younger_ones_stay(team: Team, settings: Any) -> None:
    settings.OZ0_RETENTION_DAYS = 30
    schedule, trigger = rows(team, [40, 35, 31, 29, 1])
    keeper = Team()
    keeper.workspace.retention_days = 0  # for ever
    keeper.workspace.save()
    kept_schedule, kept_trigger = rows(keeper, [400, 40])
    pruned = retention.prune(batch=2)
    assert (pruned.firings, pruned.deliveries) == (3, 3)
    assert Firing.objects.filter(schedule=schedule).count() == 2 and TriggerDelivery.objects.filter(trigger=trigger).count() == 2
    assert Firing.objects.filter(schedule=kept_schedule).count() == 2
    assert TriggerDelivery.objects.filter(trigger=kept_trigger).count() == 2
    assert retention.prune().firings == 0  # a second pass finds nothing


def test_a_workspaces_own_retention_wins_over_the_installs(team: Team, settings: Any) -> None:
    settings.OZ0_RETENTION_DAYS = 365
    team.workspace.retention_days = 7
    team.workspace.save()
    schedule, _ = rows(team, [8, 6])
    assert retention.prune().firings == 1 and Firing.objects.filter(schedule=schedule).count() == 1


def test_a_batch_of_zero_rows_is_refused(db: Any) -> None:
    with pytest.raises(ValueError):
        retention.prune(batch=0)
