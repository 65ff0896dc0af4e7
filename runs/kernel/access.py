"""Who acts, and whether they may write: the standing every kernel entry point checks first."""

from __future__ import annotations

from typing import Any

from runs.kernel.errors import ContentHidden, Forbidden, NotFound
from runs.models import Run
from runs.permissions import can_read_content
from tenancy.permissions import has_write_standing, is_member


def actor_name(user: Any) -> str:
    if user is None:
        return "kernel"
    return getattr(user, "username", str(user))


def require_write(user: Any, workspace_id: int) -> None:
    if user is None:
        return  # the kernel's own callers (sweeps, the demo loader) act for the platform
    if not is_member(user, workspace_id):
        raise NotFound("workspace")
    if not has_write_standing(user, workspace_id):
        raise Forbidden()


def require_content(user: Any, run: Run) -> None:
    """Approving, denying or answering decides on the run's words: whoever decides must be able to
    read them (F11); someone else's private run is not decided blind."""
    if user is None:
        return
    if not can_read_content(user, run):
        raise ContentHidden()
