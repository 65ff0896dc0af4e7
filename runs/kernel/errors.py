from __future__ import annotations

from typing import Any


class KernelError(Exception):
    """A typed refusal: the API answers it as {"error": {"key", "detail"}} with `status`."""

    status = 400

    def __init__(self, key: str, detail: str = "", *, status: int | None = None, extra: dict[str, Any] | None = None) -> None:
        super().__init__(f"{key}: {detail}" if detail else key)
        self.key = key
        self.detail = detail
        # Fields the error's body carries beside key and detail (the calls a retry must confirm).
        self.extra = dict(extra or {})
        if status is not None:
            self.status = status


class InvalidRequest(KernelError):
    status = 400


class NotFound(KernelError):
    status = 404

    def __init__(self, what: str = "run") -> None:
        super().__init__("not_found", f"no such {what}")


class Forbidden(KernelError):
    status = 403

    def __init__(self, detail: str = "this needs write standing (the operator role) on the workspace") -> None:
        super().__init__("forbidden", detail)


class Conflict(KernelError):
    status = 409


class ContentHidden(KernelError):
    """Deciding a call or answering a question needs to read it (F11): its words are hidden from
    this person (someone else's private run), so they may not decide it blind."""

    status = 403

    def __init__(self, detail: str = "deciding this needs to read it: the run's words are hidden from you") -> None:
        super().__init__("content_hidden", detail)


class NotAnApprover(KernelError):
    """A call an approver group owns (its tool matches the group's patterns) is decided by that
    group's members only (tenancy/approvers.py): the body names the groups."""

    status = 403

    def __init__(self, groups: tuple[str, ...]) -> None:
        named = ", ".join(groups)
        super().__init__(
            "not_an_approver",
            f"this call is decided by the members of {'group' if len(groups) == 1 else 'groups'} {named}; you are not one",
            extra={"groups": list(groups)},
        )


class QuotaExceeded(KernelError):
    """A workspace's quota would be passed: nothing was written. 429 for what frees itself (active
    runs finish), 403 for what does not (a run's tasks, the workspace's stored input)."""

    def __init__(self, quota: str, limit: int, detail: str, *, status: int) -> None:
        super().__init__("quota_exceeded", detail, status=status)
        self.extra = {"quota": quota, "limit": limit}
