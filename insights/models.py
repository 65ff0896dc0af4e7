"""Rollups that keep scorecards fast at a million findings (F18).

Nothing in Python writes these tables: PostgreSQL triggers created by the
migration `0002_rollup_triggers` keep them current in the same transaction as
the kernel's own writes (a run created, a finding written, a repair traced),
so the kernel stays the only writer of run state and the counts cannot drift
from it. Deleting a run does not decrement anything: summaries outlive runs.

`agent_version` is 0 for a run that recorded no version, so the unique keys
that the triggers' upserts rely on never contain NULL.
"""

from __future__ import annotations

from django.db import models


class FailureDaily(models.Model):
    """Failed runs (findings) per agent, version, workspace, kind and day."""

    agent_name = models.CharField(max_length=100)
    agent_version = models.PositiveIntegerField(default=0)
    workspace_id = models.BigIntegerField()
    kind = models.CharField(max_length=40)
    day = models.DateField()
    failed = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["agent_name", "agent_version", "workspace_id", "kind", "day"], name="failure_daily_key"
            ),
        ]
        # Covering: a windowed scorecard is an index-only scan over one agent's days.
        indexes = [
            models.Index(
                fields=["agent_name", "day"],
                include=["agent_version", "workspace_id", "kind", "failed"],
                name="failure_daily_cover",
            )
        ]

    def __str__(self) -> str:
        return f"{self.agent_name}@{self.agent_version} {self.kind} {self.day}: {self.failed}"


class RunDaily(models.Model):
    """Runs started per agent, version, workspace and day: the denominator of a failure rate."""

    agent_name = models.CharField(max_length=100)
    agent_version = models.PositiveIntegerField(default=0)
    workspace_id = models.BigIntegerField()
    day = models.DateField()
    started = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["agent_name", "agent_version", "workspace_id", "day"], name="run_daily_key"),
        ]
        indexes = [
            models.Index(
                fields=["agent_name", "day"], include=["agent_version", "workspace_id", "started"], name="run_daily_cover"
            )
        ]

    def __str__(self) -> str:
        return f"{self.agent_name}@{self.agent_version} {self.day}: {self.started}"


class RepairDaily(models.Model):
    """Repairs (retried, abandoned) per agent, version, workspace and day.

    `held` counts the repairs that released a hold; `held_seconds` sums their time
    from the hold's start (`Run.held_since`) to the repair, `held_seconds_max` keeps
    the longest.
    """

    agent_name = models.CharField(max_length=100)
    agent_version = models.PositiveIntegerField(default=0)
    workspace_id = models.BigIntegerField()
    resolution = models.CharField(max_length=16)
    day = models.DateField()
    repairs = models.PositiveBigIntegerField(default=0)
    held = models.PositiveBigIntegerField(default=0)
    held_seconds = models.FloatField(default=0)
    held_seconds_max = models.FloatField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["agent_name", "agent_version", "workspace_id", "resolution", "day"], name="repair_daily_key"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.agent_name}@{self.agent_version} {self.resolution} {self.day}: {self.repairs}"


# All-time totals: the same counts without the day, so a scorecard over an agent's whole
# history reads a few hundred rows, not a year of days. Kept by the same triggers.


class FailureTotal(models.Model):
    agent_name = models.CharField(max_length=100)
    agent_version = models.PositiveIntegerField(default=0)
    workspace_id = models.BigIntegerField()
    kind = models.CharField(max_length=40)
    failed = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["agent_name", "agent_version", "workspace_id", "kind"], name="failure_total_key")
        ]

    def __str__(self) -> str:
        return f"{self.agent_name}@{self.agent_version} {self.kind}: {self.failed}"


class RunTotal(models.Model):
    agent_name = models.CharField(max_length=100)
    agent_version = models.PositiveIntegerField(default=0)
    workspace_id = models.BigIntegerField()
    started = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["agent_name", "agent_version", "workspace_id"], name="run_total_key")]

    def __str__(self) -> str:
        return f"{self.agent_name}@{self.agent_version}: {self.started}"


class RepairTotal(models.Model):
    agent_name = models.CharField(max_length=100)
    agent_version = models.PositiveIntegerField(default=0)
    workspace_id = models.BigIntegerField()
    resolution = models.CharField(max_length=16)
    repairs = models.PositiveBigIntegerField(default=0)
    held = models.PositiveBigIntegerField(default=0)
    held_seconds = models.FloatField(default=0)
    held_seconds_max = models.FloatField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["agent_name", "agent_version", "workspace_id", "resolution"], name="repair_total_key"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.agent_name}@{self.agent_version} {self.resolution}: {self.repairs}"
