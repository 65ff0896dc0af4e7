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


# Code versions and model usage (issue 29): all-time totals kept by the triggers of the migration
# `0006_code_and_usage_totals`, like the others. They are keyed by the run's code digest
# (oz0agents.code_version, "" when the agent has no code of its own), so a scorecard tells a code
# change under one manifest (one version, two digests) from a manifest change (two versions).


class CodeRunTotal(models.Model):
    """Runs started per agent, version, workspace and the digest of the code the run was created with."""

    agent_name = models.CharField(max_length=100)
    agent_version = models.PositiveIntegerField(default=0)
    workspace_id = models.BigIntegerField()
    code_digest = models.CharField(max_length=64)
    started = models.PositiveBigIntegerField(default=0)
    first_started_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["agent_name", "agent_version", "workspace_id", "code_digest"], name="code_run_total_key"
            )
        ]

    def __str__(self) -> str:
        return f"{self.agent_name}@{self.agent_version} code {self.code_digest[:12]}: {self.started}"


class UsageTotal(models.Model):
    """Model calls and their tokens (the runs' `provider_call` trace events) per agent, version,
    workspace, code digest and route (`provider:model`, or the model a framework named)."""

    agent_name = models.CharField(max_length=100)
    agent_version = models.PositiveIntegerField(default=0)
    workspace_id = models.BigIntegerField()
    code_digest = models.CharField(max_length=64)
    route = models.CharField(max_length=200)
    calls = models.PositiveBigIntegerField(default=0)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["agent_name", "agent_version", "workspace_id", "code_digest", "route"], name="usage_total_key"
            )
        ]

    def __str__(self) -> str:
        return f"{self.agent_name}@{self.agent_version} {self.route}: {self.calls} calls"


class FailureGroup(models.Model):
    """Failures of one shape in one workspace (runs.fingerprints): the same kind, agent, error key
    and message with its numbers, ids and quoted values masked. Counted by the trigger of
    `0008_failure_group_triggers` as findings are written; it keeps no words.

    `resolved_in_version` is set by a person (insights.groups.resolve): the group is fixed as of
    that version of the agent, and a finding of a later version means it came back.
    """

    workspace_id = models.BigIntegerField()
    fingerprint = models.CharField(max_length=32)
    agent_name = models.CharField(max_length=100)
    kind = models.CharField(max_length=40)
    error_key = models.CharField(max_length=64, blank=True, default="")
    failed = models.PositiveBigIntegerField(default=0)
    first_seen = models.DateTimeField()
    last_seen = models.DateTimeField()
    # 0 for findings of runs that recorded no version, as in the rollups.
    first_version = models.PositiveIntegerField(default=0)
    last_version = models.PositiveIntegerField(default=0)
    resolved_in_version = models.PositiveIntegerField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by_id = models.BigIntegerField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workspace_id", "fingerprint"], name="failure_group_key")]
        # A scorecard's top groups: one agent's groups, commonest first.
        indexes = [models.Index(fields=["agent_name", "-failed"], name="failure_group_top")]

    def __str__(self) -> str:
        return f"{self.agent_name} {self.kind} {self.fingerprint[:8]}: {self.failed}"

    @property
    def regressed(self) -> bool:
        """Marked resolved in a version, then failed again in a later one."""
        return self.resolved_in_version is not None and self.last_version > self.resolved_in_version


class FailureGroupVersion(models.Model):
    """A group's failures in one version of its agent: the versions it affects. It repeats the
    group's agent so one version's top groups are an index scan, not a join over every group."""

    workspace_id = models.BigIntegerField()
    fingerprint = models.CharField(max_length=32)
    agent_name = models.CharField(max_length=100)
    agent_version = models.PositiveIntegerField(default=0)
    failed = models.PositiveBigIntegerField(default=0)
    first_seen = models.DateTimeField()
    last_seen = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workspace_id", "fingerprint", "agent_version"], name="failure_group_version_key")
        ]
        indexes = [models.Index(fields=["agent_name", "agent_version", "-failed"], name="failure_group_version_top")]

    def __str__(self) -> str:
        return f"{self.fingerprint[:8]}@{self.agent_version}: {self.failed}"


# A manager's numbers (issue 31): model usage and run durations per day, so a date range reads
# summary rows, never the runs or their trace events. Kept by the triggers of the migration
# `0009_i31_numbers_usage_and_durations`, like the others.


class UsageDaily(models.Model):
    """Model calls and their tokens per agent, version, workspace, route and UTC day (the day of the call)."""

    agent_name = models.CharField(max_length=100)
    agent_version = models.PositiveIntegerField(default=0)
    workspace_id = models.BigIntegerField()
    route = models.CharField(max_length=200)
    day = models.DateField()
    calls = models.PositiveBigIntegerField(default=0)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["agent_name", "agent_version", "workspace_id", "route", "day"], name="usage_daily_key"
            )
        ]
        indexes = [
            models.Index(
                fields=["agent_name", "day"],
                include=["agent_version", "workspace_id", "route", "calls", "input_tokens", "output_tokens"],
                name="usage_daily_cover",
            )
        ]

    def __str__(self) -> str:
        return f"{self.agent_name}@{self.agent_version} {self.route} {self.day}: {self.calls} calls"


class DurationBins(models.Model):
    """The columns the daily and weekly duration rollups share (each adds its day or week)."""

    agent_name = models.CharField(max_length=100)
    agent_version = models.PositiveIntegerField(default=0)
    workspace_id = models.BigIntegerField()
    bin = models.SmallIntegerField()
    runs = models.PositiveBigIntegerField(default=0)
    seconds = models.FloatField(default=0)

    class Meta:
        abstract = True


class DurationDaily(DurationBins):
    """Finished runs per agent, version, workspace, UTC day of the finish and duration bin.

    A run's duration is `finished_at - created_at`; its bin is floor(ln(ms) / ln(1.1)) (ms at
    least 1), so a bin spans 10 % and a percentile read from the bins (insights.numbers) is
    within 5 % of the true one. `seconds` sums the exact durations (for a mean)."""

    day = models.DateField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["agent_name", "agent_version", "workspace_id", "day", "bin"], name="duration_daily_key"
            )
        ]
        indexes = [
            models.Index(
                fields=["agent_name", "day"],
                include=["agent_version", "workspace_id", "bin", "runs", "seconds"],
                name="duration_daily_cover",
            )
        ]

    def __str__(self) -> str:
        return f"{self.agent_name}@{self.agent_version} {self.day} bin {self.bin}: {self.runs}"


class DurationWeekly(DurationBins):
    """DurationDaily summed per ISO week (`week` is its Monday): a long range in weekly buckets
    reads its whole weeks here, a seventh of the rows, and only the days the range cuts from the
    daily rows. Kept by the same triggers."""

    week = models.DateField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["agent_name", "agent_version", "workspace_id", "week", "bin"], name="duration_weekly_key"
            )
        ]
        indexes = [
            models.Index(
                fields=["agent_name", "week"],
                include=["agent_version", "workspace_id", "bin", "runs", "seconds"],
                name="duration_weekly_cover",
            )
        ]

    def __str__(self) -> str:
        return f"{self.agent_name}@{self.agent_version} week {self.week} bin {self.bin}: {self.runs}"
