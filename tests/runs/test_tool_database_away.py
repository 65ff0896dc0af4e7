"""A tool call that meets the database away is left to the lease sweep, never a false
`tool_failed` (the chaos run's PostgreSQL kill met one); any other exception is the tool's failure."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import OperationalError

from runs.kernel import Claimed
from runs.worker import execution


def _claimed() -> Claimed:
    return Claimed(1, "00000000-0000-0000-0000-000000000000", "t", "tool", {"tool": "clock.now", "args": {}}, 1, "c", {}, "t")


@pytest.mark.spec("S10")
def test_a_database_error_inside_a_tool_is_raised_for_the_lease_sweep_and_a_bug_is_tool_failed(monkeypatch: Any) -> None:
    import threading

    def away(args: Any, context: Any) -> Any:
        raise OperationalError("connection failed: Connection refused")

    monkeypatch.setattr(execution, "function_of", lambda name: away)
    with pytest.raises(OperationalError):
        execution._tool_outcome(_claimed(), threading.Event())
    monkeypatch.setattr(execution, "function_of", lambda name: lambda args, context: 1 / 0)
    outcome = execution._tool_outcome(_claimed(), threading.Event())
    assert outcome.error is not None and outcome.error[0] == "tool_failed"
