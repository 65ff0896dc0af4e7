"""The console's own rows: what a person keeps for their own view of a workspace."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class SavedRunFilter(models.Model):
    """A runs-list filter a person saved under a name, in one workspace: theirs alone.

    `query` is the filter as the runs list's query string reads it (runs.run_list.RunFilter.as_query),
    read again through the same parser when it is applied, so a stored filter is never trusted."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    workspace = models.ForeignKey("tenancy.Workspace", on_delete=models.CASCADE, related_name="+", db_index=False)
    name = models.CharField(max_length=80)
    query = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # Also the index of a person's filters in a workspace, by name.
        constraints = [models.UniqueConstraint(fields=["user", "workspace", "name"], name="saved_filter_unique_name")]

    def __str__(self) -> str:
        return self.name


class PersonSettings(models.Model):
    """A person's own console settings: the time zone pages render times in (issue 30.8)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True, related_name="+")
    time_zone = models.CharField(max_length=64, default="UTC")

    def __str__(self) -> str:
        return self.time_zone
