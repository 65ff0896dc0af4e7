"""Agents and their registered versions.

The tables keep the names they had when these models lived in `runs` (`runs_agent`,
`runs_agentversion`): the move to this app changed the code's rooms, not the database.
"""

from __future__ import annotations

from django.db import models


class Agent(models.Model):
    """An agent belongs to one workspace: its operators register its versions, and runs of that
    workspace name it. Another workspace may have an agent of the same name; they are unrelated."""

    workspace = models.ForeignKey("tenancy.Workspace", on_delete=models.CASCADE, related_name="agents")
    name = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)
    # The version new runs take: null is the newest registered (oz0agents.rollouts). A canary
    # rollout pins it to the version before the canary; a rollback leaves it there.
    stable_version = models.ForeignKey("AgentVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # A version being tried on `canary_percent` of new runs (0 to 100 by a hash of the run's id).
    canary_version = models.ForeignKey("AgentVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    canary_percent = models.PositiveSmallIntegerField(default=0)
    canary_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "runs_agent"
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="agent_unique_name_per_workspace")]

    def __str__(self) -> str:
        return self.name


class AgentVersion(models.Model):
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    manifest_text = models.TextField()
    manifest = models.JSONField()
    digest = models.CharField(max_length=64)
    # The digest of the code its harness ran when it was registered (oz0agents.code_version); ""
    # for an agent of oz0's own loop, or a version registered before code had a version.
    code_digest = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "runs_agentversion"
        constraints = [models.UniqueConstraint(fields=["agent", "version"], name="agent_version_unique")]
        ordering = ["agent", "-version"]

    def __str__(self) -> str:
        return f"{self.agent.name}@{self.version}"


class RolloutEvent(models.Model):
    """The audit trail of an agent's rollouts: a canary started, promoted, rolled back (by a person
    or by the sweep), or superseded by a version registered whole."""

    workspace = models.ForeignKey("tenancy.Workspace", on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey(Agent, null=True, on_delete=models.SET_NULL, related_name="rollout_events")
    agent_name = models.CharField(max_length=100)
    actor = models.CharField(max_length=150)
    verb = models.CharField(max_length=32)
    canary_version = models.PositiveIntegerField(null=True)
    stable_version = models.PositiveIntegerField(null=True)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["workspace", "-created_at"], name="rollout_event_ws_recent")]

    def __str__(self) -> str:
        return f"{self.agent_name} {self.verb}"
