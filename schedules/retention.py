"""Retention for schedules and triggers: a schedule's firings and a trigger's deliveries older
than their workspace's retention (runs/retention.py's cutoffs: `retention_days`, else
OZ0_RETENTION_DAYS; 0 keeps them for ever) are deleted in batches of OZ0_PRUNE_BATCH, one short
statement each. Beat sends `schedules.tasks.prune` every OZ0_PRUNE_SECONDS.

A delivery is the memory of an idempotency key: a sender retrying one after its workspace's
retention (days, at the least) starts a run again, as it would after the trigger was made anew.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db.models import Model, QuerySet
from django.utils import timezone

from runs.retention import cutoffs
from schedules.models import Firing, TriggerDelivery


@dataclass
class Pruned:
    firings: int = 0
    deliveries: int = 0


def _in_batches(rows: QuerySet[Model], batch: int) -> int:
    deleted = 0
    while True:
        ids = list(rows.values_list("pk", flat=True)[:batch])
        if not ids:
            return deleted
        count, _ = rows.model._default_manager.filter(pk__in=ids).delete()
        deleted += count
        if len(ids) < batch:
            return deleted


def prune(*, now: datetime | None = None, batch: int | None = None) -> Pruned:
    size = int(batch if batch is not None else settings.OZ0_PRUNE_BATCH)
    if size <= 0:
        raise ValueError("the prune batch must be a positive number of rows")
    pruned = Pruned()
    for workspace, cutoff in cutoffs(now or timezone.now()).items():
        firings = Firing.objects.filter(schedule__workspace_id=workspace, fired_at__lt=cutoff).order_by("pk")
        pruned.firings += _in_batches(firings, size)
        deliveries = TriggerDelivery.objects.filter(trigger__workspace_id=workspace, received_at__lt=cutoff).order_by("pk")
        pruned.deliveries += _in_batches(deliveries, size)
    return pruned
