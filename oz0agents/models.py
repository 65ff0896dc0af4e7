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
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "runs_agentversion"
        constraints = [models.UniqueConstraint(fields=["agent", "version"], name="agent_version_unique")]
        ordering = ["agent", "-version"]

    def __str__(self) -> str:
        return f"{self.agent.name}@{self.version}"
