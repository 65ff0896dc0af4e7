"""A person's subscription to what waits on them in one workspace, and its delivery state.

The kernel knows nothing of this app: a beat-driven sweep reads waits (tasks and runs) and
delivers digests (notify/digests.py).
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models

from runs.models import Run
from tenancy.models import Workspace

# "rollback": a canary the sweep rolled back (oz0agents.rollouts), news as the waits are.
# "deadline": a wait the subscriber owns reached its reminder or escalation time (notify/deadlines.py);
# a subscription to a wait's own kind hears of its deadlines too.
WAIT_KINDS = ("approval", "question", "hold", "rollback", "deadline")


class Subscription(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notify_subscriptions")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="notify_subscriptions")
    kinds = ArrayField(models.CharField(max_length=16), default=list)
    # Blank: every agent of the workspace.
    agent = models.CharField(max_length=100, blank=True, default="")
    # E-mail goes to the account's own address only: a subscription cannot mail strangers.
    email = models.BooleanField(default=False)
    webhook_url = models.CharField(max_length=2000, blank=True, default="")
    # Signs the webhook body (HMAC-SHA256); kept to sign with, shown to the person once.
    secret = models.CharField(max_length=64, blank=True, default="")
    interval_seconds = models.PositiveIntegerField(default=900)
    created_at = models.DateTimeField(auto_now_add=True)
    # Waits that began after this instant are news to the next digest.
    watermark = models.DateTimeField()
    last_digest_at = models.DateTimeField(null=True, blank=True)
    # Set when the sweep hands the subscription to a delivery message; cleared when it settles.
    queued_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")
    consecutive_failures = models.PositiveIntegerField(default=0)
    digests_sent = models.PositiveIntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["user", "-created_at"], name="notify_sub_user_recent")]

    def __str__(self) -> str:
        return f"subscription {self.pk} of {self.user_id} to {self.workspace_id}"


class WaitNotice(models.Model):
    """One stage of one wait told to people: a reminder to its owners, or an escalation to the next
    role or group. One row per (wait, stage): the wait is its run, its task (blank for a hold) and the
    instant it began, so a reminder goes out once however many sweeps see it, and a wait that ends
    and begins again (a call re-parked, a run held anew) is a new wait."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+", db_index=False)
    task_key = models.CharField(max_length=200, blank=True, default="")
    kind = models.CharField(max_length=16)  # approval, question, hold
    stage = models.CharField(max_length=16)  # reminder, escalation
    since = models.DateTimeField()
    created_at = models.DateTimeField()
    # Whose it was when told (e.g. "group payments", "operators") and who was told (usernames).
    owners = ArrayField(models.CharField(max_length=80), default=list)
    targets = ArrayField(models.CharField(max_length=80), default=list)
    recipients = ArrayField(models.CharField(max_length=150), default=list)
    # The subscriptions a delivery reached: a retry sends to the others only.
    delivered_to = ArrayField(models.BigIntegerField(), default=list)
    delivered_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "task_key", "stage", "since"], name="wait_notice_once_per_stage")]

    def __str__(self) -> str:
        return f"{self.stage} of {self.kind} {self.run_id}:{self.task_key}"
