"""The test tools' ledgers: bookkeeping a test reads to count what really ran."""

from __future__ import annotations

from django.db import models


class EffectRecord(models.Model):
    """The ledger of `test.effect` executions (counts how often an effect really ran)."""

    effect_id = models.CharField(max_length=200, db_index=True)
    # The workspace of the run whose call ran it: the ledger answers only that workspace's members.
    workspace_id = models.BigIntegerField(null=True, blank=True)
    replayable = models.BooleanField(default=False)
    # The execution that wrote the record (ToolContext.execution): a write whose answer was lost is
    # looked up by it once the database answers again, never written twice.
    execution = models.CharField(max_length=200, unique=True, null=True, blank=True)
    at = models.DateTimeField(auto_now_add=True)
    # When the execution's stay ended (null: it never did, its worker died): two executions of one
    # call that overlap ran at once.
    finished_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.effect_id


class FlakyCounter(models.Model):
    """Attempts seen per `test.flaky` id."""

    flaky_id = models.CharField(max_length=200, unique=True)
    attempts = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.flaky_id}: {self.attempts}"
