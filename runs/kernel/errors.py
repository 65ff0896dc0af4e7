from __future__ import annotations


class KernelError(Exception):
    """A typed refusal: the API answers it as {"error": {"key", "detail"}} with `status`."""

    status = 400

    def __init__(self, key: str, detail: str = "", *, status: int | None = None) -> None:
        super().__init__(f"{key}: {detail}" if detail else key)
        self.key = key
        self.detail = detail
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
