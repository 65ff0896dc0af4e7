"""Bulk repair chooses a held delegate task by its child's kind (F14, S14): a `child_failed` task
carries the child's failure, and "retry kind not_found" must find it, while "kind error" must not."""

from __future__ import annotations

from typing import Any

import pytest

from runs.models import Task
from tests.conftest import Team
from tests.delegation.tree import agent, create, drive_tree

pytestmark = pytest.mark.usefixtures("no_dispatch")


@pytest.mark.spec("F14", "S14")
def test_bulk_repair_filters_a_child_failed_task_by_its_childs_kind(team: Team, django_capture_on_commit_callbacks: Any) -> None:
    helper = agent(
        team.workspace,
        "model: script\ntools: [oz.fail]\nfailures:\n  - kind: not_found\n    description: Gone\n"
        "approval: {mode: bypass}\nscript:\n  - oz_fail: {kind: not_found, message: no such ledger}\n",
    )
    parent = create(
        team.workspace, team.users["operator"], tasks=[{"key": "d", "kind": "delegate", "agent": helper, "on_failure": "halt"}]
    )
    parent = drive_tree(parent, django_capture_on_commit_callbacks)
    assert parent.status == "needs_attention" and parent.attention["kinds"] == ["not_found"]
    api = team.api("operator")
    status, body = api.post(f"/workspaces/{team.slug}/holds/retry", {"kind": "not_found", "dry_run": True})
    assert status == 200, body
    assert [(r["run"], r["task_keys"], r["kinds"]) for r in body["runs"]] == [(str(parent.pk), ["d"], ["not_found"])]
    for other in ("error", "unavailable"):
        status, body = api.post(f"/workspaces/{team.slug}/holds/retry", {"kind": other, "dry_run": True})
        assert status == 200 and body["count"] == 0, (other, body)
    # The error key still chooses it as well.
    status, body = api.post(f"/workspaces/{team.slug}/holds/abandon", {"error_key": "child_failed", "dry_run": True})
    assert status == 200 and body["count"] == 1
    status, body = api.post(f"/workspaces/{team.slug}/holds/abandon", {"kind": "not_found"})
    assert status == 200 and body["count"] == 1, body
    assert body["results"][0]["outcome"] == "abandoned" and body["results"][0]["task_keys"] == ["d"]
    assert Task.objects.get(run=parent, key="d").failure_resolution == "abandoned"
