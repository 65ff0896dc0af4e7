"""Quick tools' calls travel in chunks and settle in one transaction per chunk."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any

import pytest
from django.test import override_settings

from runs import kernel
from runs.kernel import quick_chunks
from runs.models import Run, TraceEvent
from runs.worker.execution import Heartbeat, tool_outcome
from tests.conftest import Team, wait_for
from tests.runs.driver import echo, fail, join, statuses, task


def create(team: Team, tasks: list[dict[str, Any]], deliverable: str) -> Run:
    run, _ = kernel.create_run(
        workspace=team.workspace, user=team.users["operator"], body={"tasks": tasks, "deliverable": deliverable}
    )
    return run


def run_chunk(run: Run, keys: list[str], claim: str = "chunk") -> int:
    ids = [task(run, k).pk for k in keys]
    claimed = kernel.claim_batch(run.pk, ids, claim)
    outcomes = [tool_outcome(c, threading.Event()) for c in claimed]
    kernel.report_batch(outcomes)
    return len(claimed)


@override_settings(OZ0_QUICK_BATCH=16, OZ0_QUICK_SPREAD=4)
def test_it_splits_ready_quick_calls_into_chunks_for_every_worker() -> None:
    assert quick_chunks([]) == []
    assert quick_chunks([1, 2, 3]) == [[1], [2], [3]]
    assert [len(c) for c in quick_chunks(list(range(64)))] == [16, 16, 16, 16]
    assert [len(c) for c in quick_chunks(list(range(100)))] == [16] * 6 + [4]
    assert [len(c) for c in quick_chunks(list(range(10)))] == [3, 3, 3, 1]


@pytest.mark.spec("S11", "S16")
def test_it_settles_a_chunk_in_one_transaction_with_each_calls_own_policy(team: Team) -> None:
    run = create(team, [echo("a", 1), fail("b"), echo("c", 3), echo("after_b", after=["b"]), join("j", ["a", "c"])], "j")
    seq_before = run.last_seq
    assert run_chunk(run, ["a", "b", "c"]) == 3
    run.refresh_from_db()
    assert statuses(run) == {"a": "completed", "b": "failed", "c": "completed", "after_b": "skipped", "j": "completed"}
    assert run.status == "completed" and run.output == {"a": 1, "c": 3}
    # One claim and one report: two run-status-free transactions, each writing its events in order.
    seqs = list(TraceEvent.objects.filter(run=run, seq__gt=seq_before).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(seq_before + 1, seq_before + 1 + len(seqs)))


def test_it_claims_only_what_is_still_queued(team: Team) -> None:
    run = create(team, [echo("a"), echo("b")], "b")
    single = kernel.claim_task(None, task(run, "a").pk, "single")
    assert single is not None
    claimed = kernel.claim_batch(run.pk, [task(run, "a").pk, task(run, "b").pk], "chunk")
    assert [c.key for c in claimed] == ["b"]
    # A report for a call the chunk does not hold changes nothing.
    assert kernel.report_batch([kernel.Outcome(replace(single, claim="chunk"), value=9)]) == []
    assert task(run, "a").status == "running"


def test_it_hands_the_next_quick_calls_to_the_reporting_worker(team: Team) -> None:
    run = create(team, [echo("a"), echo("b", after=["a"]), echo("c", after=["b"])], "c")
    claimed = kernel.claim_batch(run.pk, [task(run, "a").pk], "w")
    seq_before = Run.objects.get(pk=run.pk).last_seq
    taken = kernel.report_batch([tool_outcome(c, threading.Event()) for c in claimed], take=2, then_claim="w2")
    # b is settled-ready and claimed in the transaction that completed a: one commit per step.
    assert [c.key for c in taken] == ["b"] and taken[0].claim == "w2" and taken[0].attempt == 1
    b = task(run, "b")
    assert (b.status, b.claim, b.ready) == ("running", "w2", False)
    # Made ready and claimed by one statement: its queue time is written all the same.
    assert b.queued_at is not None and b.queued_at == b.started_at
    events = list(TraceEvent.objects.filter(run=run, seq__gt=seq_before).order_by("seq").values_list("task_key", "to_status"))
    assert events == [("a", "completed"), ("b", "running")]
    # Without a claim to take them under, the next calls stay queued for any worker.
    more = kernel.report_batch([tool_outcome(c, threading.Event()) for c in taken], take=2)
    assert more == [] and task(run, "c").ready and task(run, "c").status == "waiting"


def test_a_taken_call_whose_worker_dies_is_handed_on_by_the_lease_sweep(team: Team) -> None:
    run = create(team, [echo("a"), echo("b", after=["a"])], "b")
    claimed = kernel.claim_batch(run.pk, [task(run, "a").pk], "w")
    taken = kernel.report_batch([tool_outcome(c, threading.Event()) for c in claimed], take=2, then_claim="w2")
    assert [c.key for c in taken] == ["b"]
    # The worker dies before running b: its lease expires and the sweep makes it queued again.
    from django.utils import timezone

    from runs.models import Task

    Task.objects.filter(pk=taken[0].task_id).update(heartbeat_at=timezone.now() - timezone.timedelta(hours=1))
    kernel.sweep_expired_claims()
    b = task(run, "b")
    assert b.status == "waiting" and b.ready and b.claim is None
    # The dead claim's late report changes nothing.
    assert kernel.report_batch([tool_outcome(taken[0], threading.Event())]) == []
    assert run_chunk(run, ["b"], claim="w3") == 1
    assert Run.objects.get(pk=run.pk).status == "completed"


def test_it_stops_a_chunk_of_a_canceled_run(team: Team) -> None:
    run = create(team, [echo("a"), echo("b")], "b")
    claimed = kernel.claim_batch(run.pk, [task(run, "a").pk], "chunk")
    kernel.cancel_run(run_id=run.pk, user=team.users["operator"], reason="stop")
    assert kernel.heartbeat("chunk") is True
    kernel.report_batch([kernel.Outcome(claimed[0], stopped=True)])
    run.refresh_from_db()
    assert run.status == "canceled" and statuses(run) == {"a": "canceled", "b": "canceled"}


def test_it_keeps_quick_tools_replayable() -> None:
    from runs.tools import Tool

    with pytest.raises(ValueError, match="replayable"):
        Tool("x.quick", "", replayable=False, quick=True)


def test_a_beat_of_the_claim_just_settled_stops_nothing_that_follows_it(settings: Any) -> None:
    """One heartbeat thread follows a worker's claims in turn. The beat of a claim that was just
    settled answers "stop" (the claim is gone): it must reach that claim's cancel only."""
    settings.OZ0_HEARTBEAT_SECONDS = 0.01
    beating, release = threading.Event(), threading.Event()

    def settled_claims_beat() -> bool:
        beating.set()
        release.wait(5)
        return True  # the claim is gone: "stop"

    with Heartbeat(settled_claims_beat, "stale") as beat:
        first = beat.cancel
        assert beating.wait(5)
        # The worker goes on to its next claim while the old beat is still in flight: it waits for it.
        followed: list[threading.Event] = []
        follower = threading.Thread(target=lambda: followed.append(beat.follow(lambda: False)))
        follower.start()
        follower.join(0.1)
        assert follower.is_alive() and not followed
        release.set()
        follower.join(5)
        assert first.is_set()
        time.sleep(0.1)  # several beats of the new claim
        assert not followed[0].is_set() and beat.cancel is followed[0]


def test_no_beat_runs_while_the_worker_reports(settings: Any) -> None:
    """A beat and a report of the same chunk would lock its rows in different orders."""
    settings.OZ0_HEARTBEAT_SECONDS = 0.01
    beats: list[float] = []
    with Heartbeat(lambda: bool(beats.append(time.monotonic())), "held") as beat:
        assert wait_for(lambda: len(beats) >= 2, timeout=5)
        with beat.held():
            held_at = time.monotonic()
            time.sleep(0.15)
            released_at = time.monotonic()
        assert wait_for(lambda: beats[-1] > released_at, timeout=5)
    assert not [at for at in beats if held_at <= at < released_at]


def test_the_heartbeat_carries_a_cancel_to_the_claim_it_follows(settings: Any) -> None:
    settings.OZ0_HEARTBEAT_SECONDS = 0.01
    stop_now = threading.Event()
    with Heartbeat(lambda: False, "follow") as beat:
        following = beat.follow(stop_now.is_set)
        time.sleep(0.05)
        assert not following.is_set()
        stop_now.set()
        assert following.wait(5)


@pytest.mark.usefixtures("committed", "no_dispatch")
def test_one_heartbeat_thread_follows_a_worker_down_a_chain_and_cancels_where_asked(settings: Any, monkeypatch: Any) -> None:
    """A worker runs the quick calls its own chunks make ready under one heartbeat thread; a cancel
    asked of a later step (here by the call itself, as an operator's cancel would be) reaches it."""
    from runs.models import Task
    from runs.worker import execution
    from runs.worker.tool_functions import FUNCTIONS, ToolCanceled

    settings.OZ0_HEARTBEAT_SECONDS = 0.02
    team = Team()
    run = create(team, [echo("a", 1), echo("b", 2, after=["a"]), echo("c", 3, after=["b"])], "c")
    original_echo = FUNCTIONS["test.echo"]
    heard: dict[str, bool] = {}

    def echo_or_wait_for_cancel(args: dict[str, Any], context: Any) -> Any:
        if context.task_key == "c":
            Task.objects.filter(run=run, key="c").update(cancel_requested=True)
            heard["c"] = context.cancel.wait(5)
            raise ToolCanceled()
        heard[context.task_key] = context.cancel.is_set()
        return original_echo(args, context)

    monkeypatch.setitem(FUNCTIONS, "test.echo", echo_or_wait_for_cancel)
    monkeypatch.setattr(execution, "CONTINUATION_SECONDS", 60.0)  # a slow machine still continues to c
    started: list[str] = []
    original_enter = execution.Heartbeat.__enter__

    def counting_enter(self: Heartbeat) -> Heartbeat:
        started.append(self.name)
        return original_enter(self)

    monkeypatch.setattr(execution.Heartbeat, "__enter__", counting_enter)
    execution.execute_batch([task(run, "a").pk], str(run.pk))
    assert heard == {"a": False, "b": False, "c": True}
    assert len(started) == 1, started
    assert statuses(run)["a"] == statuses(run)["b"] == "completed"
    assert task(run, "c").status != "completed"
