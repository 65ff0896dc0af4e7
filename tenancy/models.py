"""Workspaces, who belongs to them in which role, and people's API tokens.

The bottom of oz0's apps: it imports no other oz0 app, and every other one may import it. The
tables keep the names they had when `runs` held these models (the move was state-only).
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models


class Role(models.TextChoices):
    VIEWER = "viewer"
    READER = "reader"
    OPERATOR = "operator"


class Workspace(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # The bytes of the inputs its people's runs store (the `input_bytes` quota), grown by each
    # create in the create's own transaction (runs/kernel/intake.py).
    stored_input_bytes = models.BigIntegerField(default=0)
    # Days its finished runs' trace (the audit trail with it) and findings are kept (runs/retention.py);
    # null: the installer's OZ0_RETENTION_DAYS; 0: kept for ever.
    retention_days = models.PositiveIntegerField(null=True, blank=True)
    # Seconds a pending approval, question or hold waits before its owners are reminded, and before
    # it is escalated (tenancy/approvers.py); null: the installer's OZ0_WAIT_REMINDER_SECONDS and
    # OZ0_WAIT_ESCALATION_SECONDS; 0: that stage is off.
    reminder_seconds = models.PositiveIntegerField(null=True, blank=True)
    escalation_seconds = models.PositiveIntegerField(null=True, blank=True)
    # Where a wait the operators own (a question, a hold, a call no group owns) escalates to; null:
    # the operators themselves, told it is overdue.
    escalate_to = models.ForeignKey("tenancy.ApproverGroup", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        db_table = "runs_workspace"

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices)

    class Meta:
        db_table = "runs_membership"
        constraints = [models.UniqueConstraint(fields=["workspace", "user"], name="membership_unique_user")]

    def __str__(self) -> str:
        return f"{self.user} {self.role} of {self.workspace}"


class ApiToken(models.Model):
    """A bearer token; only its SHA-256 is stored, with its first characters as a hint a person
    can recognize it by. A revoked or expired token authenticates nobody."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    digest = models.CharField(max_length=64, unique=True)
    hint = models.CharField(max_length=8, blank=True, default="")
    label = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "runs_apitoken"

    def __str__(self) -> str:
        return f"token {self.label or self.pk} of {self.user_id}"


class SsoIdentity(models.Model):
    """The person an OpenID Connect provider's subject signs in as (tenancy/sso.py). Keyed by the
    issuer's `sub`, never by email: an account at the provider that claims someone's address
    does not become their oz0 account."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identities")
    issuer = models.CharField(max_length=500)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    last_signed_in_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="sso_identity_unique_subject")]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"


class Wall(models.Model):
    """Members walled off from one agent's runs in a workspace: the third reason, beside role and a
    private run, that a run's words are closed to a reader (F11). Behind the wall a member sees
    kinds, flags and counts, as a viewer does, on every surface `runs.permissions` decides for."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="walls")
    agent_name = models.CharField(max_length=100)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="walls")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workspace", "agent_name"], name="wall_one_per_agent")]

    def __str__(self) -> str:
        return f"wall around {self.agent_name} in {self.workspace}"


class ApproverGroup(models.Model):
    """Who may decide a workspace's calls of some tools: a call whose tool matches one of `tools`
    (fnmatch patterns such as `payments.*`) is decided only by the members of a group it matches
    (any of them, when it matches several). With `two_approvers`, such a call that is not
    replayable runs only once two different members approved it. A wait past its escalation time
    is told to `escalate_to` (another group), or to the workspace's operators when it names none."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="approver_groups")
    name = models.CharField(max_length=64)
    tools = ArrayField(models.CharField(max_length=200), default=list)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="approver_groups")
    two_approvers = models.BooleanField(default=False)
    escalate_to = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="approver_group_unique_name")]

    def __str__(self) -> str:
        return f"approver group {self.name} of {self.workspace}"
