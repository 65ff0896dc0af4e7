"""Redis killed (the broker, the channel layer and the cache at once): a request whose transaction
committed answers its success (the lost-message sweep sends its tasks once Redis is back), and a
client's keyed retry starts nothing twice."""

from __future__ import annotations

import pytest

from bench.chaos import Client
from bench.chaos_stack import Stack
from tests.faults.conftest import create, run_status, tag, task_row, wait

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(300)]


def round_asking(name: str) -> dict[str, object]:
    script = [{"tool_calls": [{"tool": "test.echo", "args": {"value": name}}]}, {"text": "done"}]
    return {"key": "r1", "kind": "round", "model": "script", "prompt": "go", "script": script}


@pytest.mark.spec("S29")
def test_requests_that_commit_while_redis_is_down_answer_success(stack: Stack, client: Client) -> None:
    asking = [create(client, [round_asking(tag())], "r1", approval={"mode": "ask"}) for _ in range(2)]
    for run_id in asking:
        wait(lambda run_id=run_id: task_row(stack, run_id, "r1.1")["status"] == "needs_approval", timeout=60, message="approvals")
    stack.redis.kill()
    try:
        workspace = stack.workspace
        name = tag()
        body = {"tasks": [{"key": "a", "kind": "tool", "tool": "test.echo", "args": {"value": name}}], "deliverable": "a"}
        status, created = client.call("POST", f"/workspaces/{workspace}/runs", body, key=name)
        assert status == 201, created
        again, replayed = client.call("POST", f"/workspaces/{workspace}/runs", body, key=name)
        assert (again, replayed) == (201, created)
        plain, other = client.call("POST", f"/workspaces/{workspace}/runs", body)
        assert plain == 201, other
        approved, answer = client.call("POST", f"/runs/{asking[0]}/tasks/r1.1/approve", {})
        assert approved == 200, answer
        denied, answer = client.call("POST", f"/runs/{asking[1]}/tasks/r1.1/deny", {"reason": "not now"})
        assert denied == 200, answer
    finally:
        stack.redis.start()
    keyed = created["run"]["id"]
    assert (
        stack.query("SELECT count(*) FROM runs_run WHERE input IS NULL AND id::text IN (%s, %s)", (keyed, other["run"]["id"]))[0][
            0
        ]
        == 2
    )
    # Back, the broker had lost the messages; the lost-message sweep sends them again.
    for run_id in (keyed, other["run"]["id"], *asking):
        wait(lambda run_id=run_id: run_status(stack, run_id) == "completed", timeout=90, message=f"run {run_id} to complete")
    assert task_row(stack, asking[1], "r1.1")["error_key"] == "approval_denied"
