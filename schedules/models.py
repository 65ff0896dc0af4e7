"""Schedules: a stored run-create body started on a clock, its firings, and who changed it.

The kernel knows nothing of this app: beat's sweep (`schedules.firing.fire_due`) creates runs
through `runs.kernel.create_run` as the schedule's owner, and cancels through `cancel_run`.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from runs.models import Run
from tenancy.models import Workspace

OVERLAPS = ("skip", "queue", "cancel")
OUTCOMES = ("started", "skipped", "queued", "canceled_previous", "missed", "refused")
AUDIT_VERBS = ("created", "changed", "paused", "resumed", "deleted")


class Schedule(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="schedules")
    name = models.CharField(max_length=64)
    # Runs are created as this person, held to their standing at each firing: an owner who is no
    # longer an operator gets the firing refused (the kernel's `forbidden` / `not_found`).
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="schedules")
    # The run-create body (API.md), compiled by the kernel when saved.
    body = models.JSONField()
    # Either a cron expression (five fields, read in `timezone`) or an interval.
    cron = models.CharField(max_length=200, blank=True, default="")
    timezone = models.CharField(max_length=64, default="UTC")
    interval_seconds = models.PositiveIntegerField(null=True, blank=True)
    # An interval counts from here (the creation, or the last change of its timing).
    anchor_at = models.DateTimeField()
    overlap = models.CharField(max_length=8, default="skip")
    # At one pass, the most due times that start a run; older ones are recorded as missed.
    catch_up = models.PositiveSmallIntegerField(default=1)
    paused = models.BooleanField(default=False)
    # The firers' compare-and-set: a pass fires only if it moves this from the value it read.
    next_fire_at = models.DateTimeField(null=True, blank=True)
    # The newest run this schedule started (the overlap policy looks at it).
    last_run = models.ForeignKey(Run, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    # `queue`: a time came while the last run was still going; it starts when that run ends.
    queued_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="schedule_name_unique_in_workspace")]
        indexes = [models.Index(fields=["next_fire_at"], name="schedule_due", condition=models.Q(paused=False))]

    def __str__(self) -> str:
        return f"{self.name} ({self.cron or f'every {self.interval_seconds} s'})"


class Firing(models.Model):
    """One due time of a schedule and what came of it."""

    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="firings")
    due_at = models.DateTimeField()
    fired_at = models.DateTimeField(auto_now_add=True)
    run = models.ForeignKey(Run, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    outcome = models.CharField(max_length=20)
    # A refusal's kernel error key (`quota_exceeded`, `forbidden`, ...) and its words.
    error_key = models.CharField(max_length=64, blank=True, default="")
    detail = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["schedule", "-id"], name="firing_newest")]

    def __str__(self) -> str:
        return f"{self.due_at:%Y-%m-%d %H:%M} {self.outcome}"


class ScheduleEvent(models.Model):
    """The audit trail: who created, changed, paused, resumed or deleted a schedule, or created or deleted a trigger."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="schedule_events")
    # Kept when the schedule is deleted: the name says which one it was.
    schedule = models.ForeignKey(Schedule, on_delete=models.SET_NULL, null=True, blank=True, related_name="events")
    schedule_name = models.CharField(max_length=64)
    # What the row is about: a schedule, or a signed trigger (then `schedule_name` is the trigger's name).
    subject = models.CharField(max_length=16, default="schedule")
    actor = models.CharField(max_length=150)
    verb = models.CharField(max_length=16)
    at = models.DateTimeField(auto_now_add=True)
    # The fields a change set, with their new values (never the run body's content).
    changes = models.JSONField(default=dict)

    class Meta:
        indexes = [models.Index(fields=["workspace", "-id"], name="schedule_event_newest")]

    def __str__(self) -> str:
        return f"{self.actor} {self.verb} {self.schedule_name}"


class Trigger(models.Model):
    """A URL an outside system posts to: its body, signed with the trigger's secret, starts a run."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="triggers")
    name = models.CharField(max_length=64)
    # The URL's unguessable part: /api/v1/triggers/<public_id>.
    public_id = models.CharField(max_length=32, unique=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="triggers")
    # A run-create body without `input`: the input is the template applied to the posted body.
    body = models.JSONField()
    # {"<input field>": "/json/pointer" | {"const": value}, ...}
    input_template = models.JSONField(default=dict)
    # Where the sender's idempotency key is: {"header": "X-GitHub-Delivery"} or {"field": "/id"}.
    idempotency = models.JSONField()
    # The secret is never stored: it is HMAC(server key, salt) (schedules/triggers.py says why).
    secret_salt = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="trigger_name_unique_in_workspace")]

    def __str__(self) -> str:
        return self.name


class TriggerDelivery(models.Model):
    """One accepted delivery, by its idempotency key: a sender's retry finds it and starts nothing."""

    trigger = models.ForeignKey(Trigger, on_delete=models.CASCADE, related_name="deliveries")
    key = models.CharField(max_length=200)
    run = models.ForeignKey(Run, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    outcome = models.CharField(max_length=16, default="started")
    error_key = models.CharField(max_length=64, blank=True, default="")
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["trigger", "key"], name="trigger_delivery_once")]

    def __str__(self) -> str:
        return f"{self.key} {self.outcome}"
