"""Where a harnessed round is sent (F7): a session waits on people and calls for as long as they
take, so it goes to the session workers' queue, never to the slots the engine's own work needs."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from oz0agents.registry import register
from runs import kernel
from runs.models import Run, Task
from tests.conftest import Team
from tests.harness.conftest import jsonl_manifest


class Sent:
    def __init__(self) -> None:
        self.singles: list[int] = []
        self.chunks: list[int] = []
        self.sessions: list[int] = []

    def __call__(
        self, ids: list[int], chunks: list[list[int]], run_id: str | None, sessions: list[int], priority: int = 5
    ) -> None:
        self.singles.extend(ids)
        self.chunks.extend(i for chunk in chunks for i in chunk)
        self.sessions.extend(sessions)


@pytest.fixture
def sent(committed: None) -> Iterator[Sent]:
    capture = Sent()
    previous = kernel.install_sender(capture)
    yield capture
    kernel.install_sender(previous)


def _run(team: Team, body: dict[str, Any]) -> Run:
    run, _ = kernel.create_run(workspace=team.workspace, user=team.users["operator"], body=body)
    return run


@pytest.mark.spec("F7")
def test_a_harnessed_round_goes_to_the_sessions_and_everything_else_to_the_workers(sent: Sent, settings: Any) -> None:
    team = Team()
    register(jsonl_manifest("jl-routed", [{"done": 1}]), workspace=team.workspace)
    harnessed = _run(team, {"agent": "jl-routed", "input": None})
    plain = _run(team, {"tasks": [{"key": "t", "kind": "tool", "tool": "test.echo", "args": {"value": 1}}]})
    harnessed_round = Task.objects.get(run=harnessed, key="r1").pk
    plain_call = Task.objects.get(run=plain, key="t").pk
    assert sent.sessions == [harnessed_round]
    assert harnessed_round not in sent.singles + sent.chunks
    assert plain_call in sent.singles + sent.chunks and plain_call not in sent.sessions

    # A message the broker lost is sent again to the same place.
    stale = timezone.now() - timedelta(hours=1)
    Task.objects.filter(pk__in=[harnessed_round, plain_call]).update(queued_at=stale)
    sent.singles.clear(), sent.chunks.clear(), sent.sessions.clear()
    assert kernel.sweep_lost_messages(broker_queue_empty=True) >= 2
    assert harnessed_round in sent.sessions and harnessed_round not in sent.singles
    assert plain_call in sent.singles and plain_call not in sent.sessions


@pytest.mark.spec("F7")
def test_one_workspaces_waiting_sessions_take_at_most_their_share_of_the_threads(sent: Sent, settings: Any) -> None:
    """A workspace whose sessions hold its share of the session threads gets no more: its next
    session is put back (queue time restarted, so the sweep does not resend it) and sent again
    later, while another workspace's session runs at once."""
    from runs.worker import execution

    settings.OZ0_SESSION_SLOTS_PER_WORKSPACE = 1
    busy, other = Team(), Team()
    for team in (busy, other):
        register(jsonl_manifest("jl-share", [{"done": "finished"}]), workspace=team.workspace)
    holding = _run(busy, {"agent": "jl-share", "input": None})
    waiting = _run(busy, {"agent": "jl-share", "input": None})
    elsewhere = _run(other, {"agent": "jl-share", "input": None})
    held = Task.objects.get(run=holding, key="r1")
    claimed = kernel.claim_task(str(holding.pk), held.pk, "a-thread-waiting-on-a-person")
    assert claimed is not None

    queued = Task.objects.get(run=waiting, key="r1")
    stale = timezone.now() - timedelta(hours=1)
    Task.objects.filter(pk=queued.pk).update(queued_at=stale)
    assert execution.execute_session(queued.pk, str(waiting.pk)) is False
    queued.refresh_from_db()
    assert (queued.status, queued.ready, queued.claim) == ("waiting", True, None)
    assert queued.queued_at > stale  # not lost: the sweep leaves it to the retry
    sent.sessions.clear()
    kernel.sweep_lost_messages(broker_queue_empty=True)
    assert queued.pk not in sent.sessions

    # Another workspace is not held back by the busy one.
    assert execution.execute_session(Task.objects.get(run=elsewhere, key="r1").pk, str(elsewhere.pk)) is True
    elsewhere.refresh_from_db()
    assert elsewhere.status == "completed" and elsewhere.output == "finished"

    # Once the holding session ends, the put-back one runs.
    assert kernel.task_complete(claimed, "done")
    assert execution.execute_session(queued.pk, str(waiting.pk)) is True
    waiting.refresh_from_db()
    assert waiting.status == "completed"
