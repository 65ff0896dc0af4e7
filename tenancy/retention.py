"""A workspace's retention: how many days its finished runs' trace and findings are kept
(runs/retention.py prunes them). The one write of `Workspace.retention_days`."""

from __future__ import annotations

from tenancy.models import Workspace

# A century: past it a number is a typo, not a retention.
MAX_RETENTION_DAYS = 36_500


class RetentionRefused(ValueError):
    """The value is not a retention: the message says what is wanted."""


def parse_retention_days(text: str) -> int | None:
    """A form's value: blank for the installer's default, else whole days (0: for ever)."""
    text = text.strip()
    if not text:
        return None
    if not text.isdigit() or int(text) > MAX_RETENTION_DAYS:
        raise RetentionRefused(f"retention must be blank (the install's default) or 0 to {MAX_RETENTION_DAYS} whole days")
    return int(text)


def set_retention_days(workspace: Workspace, days: int | None) -> None:
    if days is not None and not 0 <= days <= MAX_RETENTION_DAYS:
        raise RetentionRefused(f"retention must be 0 to {MAX_RETENTION_DAYS} days")
    Workspace.objects.filter(pk=workspace.pk).update(retention_days=days)
    workspace.retention_days = days
