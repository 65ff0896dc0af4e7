"""Run priorities (issue 33 item 3): a run's priority orders the dispatch of its queued calls and
rounds within its workspace's share of the workers, aged so a low one is never starved; the
lost-message sweep and the broker's message priority follow it; children and scheduled runs
inherit it."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from runs import kernel
from runs.models import Run, Task
from schedules import firing, services
from tests.conftest import Team
from tests.delegation.tree import agent, drive_tree
from tests.runs.test_fair_share import sleeping

pytestmark = pytest.mark.django_db
WAITING_KEY = kernel.PRIORITY_WAITING_KEY


def _queued(team: Team, priority: Any, key: str = "a") -> Task:
    body: dict[str, Any] = {"tasks": [sleeping(key, 30)]}
    if priority is not None:
        body["priority"] = priority
    run, _ = kernel.create_run(workspace=team.workspace, user=team.users["operator"], body=body)
    return Task.objects.get(run=run, key=key)


def _waited(task: Task, seconds: float) -> None:
    since = (timezone.now() - timedelta(seconds=seconds)).isoformat()
    Task.objects.filter(pk=task.pk).update(state={WAITING_KEY: {"since": since}})


@pytest.mark.usefixtures("no_dispatch")
def test_a_freed_worker_takes_the_highest_priority_first_whatever_the_order_they_were_made_in() -> None:
    """Before, `send_within_share` handed on the workspace's oldest queued call: low, then normal, then high."""
    team = Team()
    low, normal, high = _queued(team, "low"), _queued(team, None), _queued(team, "high")
    assert [Run.objects.get(pk=t.run_id).priority for t in (low, normal, high)] == [0, 5, 9]
    assert kernel.send_within_share(str(low.run_id), 2) == [high.pk, normal.pk]
    assert kernel.send_within_share(str(low.run_id), 3) == [high.pk, normal.pk, low.pk]
    # Equal priorities keep the order they were made in.
    second_high = _queued(team, 9)
    assert kernel.send_within_share(str(low.run_id), 2) == [high.pk, second_high.pk]


@pytest.mark.usefixtures("no_dispatch")
def test_a_low_priority_call_ages_past_higher_ones_so_it_is_never_starved(settings: Any) -> None:
    settings.OZ0_PRIORITY_AGING_SECONDS = 30
    team = Team()
    low, normal, high = _queued(team, "low"), _queued(team, "normal"), _queued(team, "high")
    _waited(low, 200)  # six steps: 0 + 6 passes normal (5), not high (9)
    assert kernel.send_within_share(str(low.run_id), 3) == [high.pk, low.pk, normal.pk]
    _waited(low, 300)  # ten steps: past any fresh call
    assert kernel.send_within_share(str(low.run_id), 3) == [low.pk, high.pk, normal.pk]
    # Equal effective priorities: the longer wait first.
    _waited(normal, 150)  # 5 + 5 = 10, as the low call's, but a shorter wait
    assert kernel.send_within_share(str(low.run_id), 3) == [low.pk, normal.pk, high.pk]


@pytest.mark.usefixtures("no_dispatch")
def test_a_call_over_its_share_remembers_when_it_first_waited_and_forgets_it_when_claimed() -> None:
    team = Team()
    holding, waiting = _queued(team, None, "a"), _queued(team, None, "b")
    assert isinstance(kernel.claim_task(str(holding.run_id), holding.pk, "w1", per_workspace=1), kernel.Claimed)
    assert kernel.claim_task(str(waiting.run_id), waiting.pk, "w2", per_workspace=1) is kernel.NO_ROOM
    kernel.defer_queued(waiting.pk)
    waiting.refresh_from_db()
    first = waiting.state[WAITING_KEY]["since"]
    kernel.defer_queued(waiting.pk)  # found no room again: its wait still runs from the first time
    waiting.refresh_from_db()
    assert waiting.state[WAITING_KEY]["since"] == first
    assert isinstance(kernel.claim_task(str(waiting.run_id), waiting.pk, "w3"), kernel.Claimed)
    waiting.refresh_from_db()
    assert WAITING_KEY not in waiting.state


def test_the_lost_message_sweep_sends_the_highest_priority_first_with_its_priority(
    django_capture_on_commit_callbacks: Any,
) -> None:
    team = Team()
    sent: list[tuple[list[int], int]] = []
    previous = kernel.install_sender(lambda ids, chunks, run_id, sessions, priority=5: sent.append((list(ids), priority)))
    try:
        low, high, normal = _queued(team, "low"), _queued(team, "high"), _queued(team, 5)
        sent.clear()
        old = timezone.now() - timedelta(seconds=float(settings.OZ0_REQUEUE_SECONDS) + 60)
        Task.objects.filter(pk__in=[low.pk, high.pk, normal.pk]).update(queued_at=old)
        with django_capture_on_commit_callbacks(execute=True):
            assert kernel.sweep_lost_messages() == 3
    finally:
        kernel.install_sender(previous)
    assert sent == [([high.pk], 9), ([normal.pk], 5), ([low.pk], 0)]


def test_every_message_to_the_workers_carries_its_runs_priority(
    monkeypatch: Any, django_capture_on_commit_callbacks: Any
) -> None:
    """The Celery adapter sends with the inverse priority (Redis pops 0 first)."""
    from runs.worker import tasks as worker_tasks

    real = kernel.install_sender(None)
    kernel.install_sender(real)
    calls: list[tuple[Any, dict[str, Any]]] = []
    monkeypatch.setattr(worker_tasks.execute_task, "apply_async", lambda args, **kw: calls.append((args, kw)))
    team = Team()
    with django_capture_on_commit_callbacks(execute=True):
        task = _queued(team, "high")
    with django_capture_on_commit_callbacks(execute=True):
        low = _queued(team, 2)
    assert calls == [((task.pk, str(task.run_id)), {"priority": 0}), ((low.pk, str(low.run_id)), {"priority": 7})]


def test_redis_hands_a_worker_the_higher_priority_message_first() -> None:
    """The broker as configured (`priority_steps` 0-9): a message sent later at a higher run
    priority is fetched first."""
    from oz0site.celery import app
    from oz0site.metering import priority_lists

    queue = f"priority-test-{uuid.uuid4().hex[:8]}"
    with app.connection_for_write() as conn:
        low = app.send_task("runs.tasks.noop", queue=queue, priority=kernel.message_priority(0), connection=conn)
        high = app.send_task("runs.tasks.noop", queue=queue, priority=kernel.message_priority(9), connection=conn)
        channel: Any = conn.default_channel
        client = channel.client
        assert sum(client.llen(name) for name in priority_lists(queue)) == 2
        got = [channel.basic_get(queue, no_ack=True).headers["id"] for _ in range(2)]
        client.delete(*priority_lists(queue))
    assert got == [high.id, low.id]


@pytest.mark.parametrize("bad", [10, -1, "urgent", True, 2.5, [], {"p": 1}, "x" * 10_000])
def test_a_bad_priority_is_refused_typed_and_nothing_is_written(bad: Any) -> None:
    team = Team()
    status, body = team.api("operator").post(f"/workspaces/{team.slug}/runs", {"tasks": [sleeping("a", 1)], "priority": bad})
    assert status == 400, body
    assert body["error"]["key"] == "invalid_field"
    assert not Run.objects.filter(workspace=team.workspace).exists()


@pytest.mark.usefixtures("no_dispatch")
def test_the_api_takes_a_priority_and_the_run_document_shows_it() -> None:
    team = Team()
    api = team.api("operator")
    status, body = api.post(f"/workspaces/{team.slug}/runs", {"tasks": [sleeping("a", 1)], "priority": "high"})
    assert status == 201, body
    assert (body["run"]["priority"], body["run"]["priority_name"]) == (9, "high")
    status, doc = team.api("viewer").get(f"/runs/{body['run']['id']}")
    assert status == 200 and (doc["priority"], doc["priority_name"]) == (9, "high")
    status, body = api.post(f"/workspaces/{team.slug}/runs", {"tasks": [sleeping("a", 1)]})
    assert body["run"]["priority"] == 5


@pytest.mark.usefixtures("no_dispatch")
def test_a_child_run_takes_its_parents_priority(team: Team, django_capture_on_commit_callbacks: Any) -> None:
    helper = agent(team.workspace, "model: script\nscript:\n  - text: done\n")
    parent, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={"tasks": [{"key": "d", "kind": "delegate", "agent": helper}], "priority": "low"},
    )
    drive_tree(parent, django_capture_on_commit_callbacks)
    [child] = Run.objects.filter(parent=parent)
    assert child.priority == 0


@pytest.mark.usefixtures("no_dispatch")
def test_a_scheduled_run_takes_its_schedules_priority(team: Team) -> None:
    name = agent(team.workspace, "model: script\nscript:\n  - text: done\n")
    body = {"name": "nightly", "run": {"agent": name, "input": {}, "priority": "high"}, "interval_seconds": 60}
    schedule = services.create(workspace=team.workspace, user=team.users["operator"], body=body)
    now = timezone.now()
    type(schedule).objects.filter(pk=schedule.pk).update(
        next_fire_at=now - timedelta(seconds=1), anchor_at=now - timedelta(seconds=61)
    )
    assert firing.fire_due(now=now) == 1
    schedule.refresh_from_db()
    assert Run.objects.get(pk=str(schedule.last_run_id)).priority == 9


@pytest.mark.usefixtures("no_dispatch")
def test_the_run_page_shows_a_priority_other_than_normal(client: Any) -> None:
    team = Team()
    task = _queued(team, "high")
    client.force_login(team.users["viewer"])
    page = client.get(f"/runs/{task.run_id}/")
    assert page.status_code == 200
    assert b'id="run-priority"' in page.content and b"priority high" in page.content
    normal = _queued(team, None)
    assert b'id="run-priority"' not in client.get(f"/runs/{normal.run_id}/").content


def test_a_session_sent_again_for_want_of_a_slot_keeps_its_message_priority(monkeypatch: Any) -> None:
    from runs.worker import execution
    from runs.worker import tasks as worker_tasks

    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(execution, "execute_session", lambda task_id, run_id: False)
    monkeypatch.setattr(worker_tasks.execute_session, "apply_async", lambda args, **kw: sent.append(kw))
    worker_tasks.execute_session.apply((1, "run"), priority=kernel.message_priority(9))
    assert [kw["priority"] for kw in sent] == [0]


@pytest.mark.usefixtures("no_dispatch")
def test_a_wait_that_is_not_a_timestamp_counts_as_none_never_a_failed_query() -> None:
    team = Team()
    low, high = _queued(team, "low"), _queued(team, "high")
    Task.objects.filter(pk=low.pk).update(state={WAITING_KEY: {"since": "'; DROP TABLE runs_task; --"}})
    assert kernel.send_within_share(str(low.run_id), 2) == [high.pk, low.pk]


def test_a_priority_is_a_json_whole_number_or_a_name() -> None:
    """JSON has one number type: 5.0 is the whole number the document's `integer` allows (the
    fuzz's positive check sent it and was refused). Fractions, booleans and other words are not."""
    from runs.kernel import InvalidRequest, parse_priority

    assert [parse_priority(value) for value in (0, 9, 5.0, 9.0, "low", "high", None)] == [0, 9, 5, 9, 0, 9, 5]
    for bad in (5.5, True, -1, 10, 10.0, "urgent", "5", [], {}):
        with pytest.raises(InvalidRequest):
            parse_priority(bad)
