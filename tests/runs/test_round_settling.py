"""Every round ends settled, whatever its provider answers and however often it is retried (S26, S28).

A round whose route had spent its attempts used to reach an assertion in the worker, leave its
claim behind and be handed on by the lease sweep every 30 s, forever.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import pytest
from django.db import transaction

from runs import kernel
from runs.kernel import Conflict
from runs.models import Run, Task, TraceEvent
from tests.conftest import Team
from tests.runs.driver import drive, task

ANSWERS: dict[str, dict[str, Any]] = {
    "200": {"text": "done"},
    "400": {"http": 400},
    "401": {"http": 401},
    "429": {"http": 429, "retry_after": 0},
    "503": {"http": 503},
    "refusal": {"refusal": "classifier", "category": "test"},
}
MANUAL_RETRIES = 1


class Instant(threading.Event):
    """A cancel event whose waits return at once: the rate-limit floor and backoffs cost nothing here."""

    def wait(self, timeout: float | None = None) -> bool:
        return self.is_set()


@pytest.fixture
def instant_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.runs import driver

    monkeypatch.setattr(driver, "cancel_event", Instant)


def held_round(team: Team, script: list[dict[str, Any]], budget: int, **round_: Any) -> Run:
    spec = {"key": "r1", "kind": "round", "model": "script:main", "prompt": "go", "script": script, "on_failure": "halt"}
    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={"tasks": [{**spec, **round_}], "deliverable": "r1", "retry": {"budget": budget}},
    )
    return drive(run)


def assert_settled(run: Run, where: str) -> None:
    rows = list(Task.objects.filter(run=run).values_list("key", "status", "claim"))
    assert all(status not in ("running", "dispatched") and claim is None for _, status, claim in rows), (where, rows)
    assert run.status in ("completed", "needs_attention"), (where, run.status, rows)


@pytest.fixture
def quiet(monkeypatch: pytest.MonkeyPatch, no_dispatch: list[int]) -> None:
    """Hundreds of runs: the driver does the work, and nobody watches the pushes."""
    monkeypatch.setattr("oz0site.realtime.publish", lambda groups, event: None)


def settle(team: Team, sequence: tuple[str, ...], budget: int) -> tuple[int, int]:
    """Run one round on the sequence under the budget, retrying it by hand while it holds and a
    retry is accepted. Returns how many answers it asked for and how many automatic re-runs it used."""
    where = f"{'-'.join(sequence)} under budget {budget}"
    run = held_round(team, [ANSWERS[a] for a in sequence], budget)
    assert_settled(run, where)
    for _ in range(MANUAL_RETRIES):
        if run.status != "needs_attention":
            break
        try:
            kernel.retry(run_id=run.pk, key="r1", user=team.users["operator"])
        except Conflict as refused:
            assert refused.key == "model_route_spent", where
            break
        run = drive(run)
        assert_settled(run, f"{where}, retried")
    events = TraceEvent.objects.filter(run=run)
    return events.filter(event="provider_call").count(), events.filter(event="auto_retry").count()


LARGEST_BUDGET = 3
LONGEST_SEQUENCE = 4


# About a minute and a half of CPU in all: in the whole suite (the rest lane's workers), not in
# --quick; one test per first answer, so the workers share it (the shortcuts below only ever
# look at sequences that begin with the same answer).
@pytest.mark.thorough
@pytest.mark.spec("S26", "S28")
@pytest.mark.parametrize("first", list(ANSWERS))
def test_it_settles_every_round_of_every_answer_sequence_and_budget(
    team: Team, quiet: None, instant_waits: None, first: str
) -> None:
    """Every sequence of up to four answers that begins with `first`, under retry budgets 0-3,
    then a manual retry while it holds.

    The provider is deterministic, so two shortcuts decide rounds without running them again:
    - a round that asked for only its first k answers (its retry included) decides every
      sequence that begins with those k answers, under the same budget;
    - a round that used u automatic re-runs under the largest budget met exactly u failures a
      re-run may follow, so it took the path of every budget of at least u.
    Each round runs in a savepoint rolled back after it, so hundreds of them leave nothing behind.
    """
    decided: dict[int, set[tuple[str, ...]]] = {budget: set() for budget in range(LARGEST_BUDGET + 1)}

    def undecided(sequence: tuple[str, ...], budget: int) -> bool:
        return not any(sequence[:k] in decided[budget] for k in range(1, len(sequence)))

    def note(sequence: tuple[str, ...], budget: int, asked: int) -> None:
        if asked < len(sequence):
            decided[budget].add(sequence[:asked])

    def settled(sequence: tuple[str, ...], budget: int) -> tuple[int, int]:
        with transaction.atomic():
            outcome = settle(team, sequence, budget)
            transaction.set_rollback(True)
        return outcome

    ran = 0
    for length in range(1, LONGEST_SEQUENCE + 1):
        for rest in itertools.product(ANSWERS, repeat=length - 1):
            sequence = (first, *rest)
            budgets = [b for b in range(LARGEST_BUDGET + 1) if undecided(sequence, b)]
            if not budgets:
                continue
            asked, used = settled(sequence, LARGEST_BUDGET)
            ran += 1
            for budget in budgets:
                if budget >= used:
                    note(sequence, budget, asked)
                else:
                    note(sequence, budget, settled(sequence, budget)[0])
                    ran += 1
    # A first answer that settles the round for good (a text, a refusal) is run alone, then once
    # before a second answer it never asks for, which decides every longer sequence; any other
    # leaves a hundred rounds or more to run.
    assert ran == 2 if first in ("200", "refusal") else ran > 100


@pytest.mark.spec("S26")
def test_it_renews_the_attempt_budget_of_an_unspent_route_on_retry(team: Team, instant_waits: None) -> None:
    script = [ANSWERS["429"], ANSWERS["429"], ANSWERS["401"], ANSWERS["200"]]
    run = held_round(team, script, 0)
    assert (task(run, "r1").error_key, run.status) == ("provider_model_unavailable", "needs_attention")
    kernel.retry(run_id=run.pk, key="r1", user=team.users["operator"])
    run = drive(run)
    assert (run.status, run.output) == ("completed", "done")


@pytest.mark.spec("S28")
def test_it_renews_the_attempt_budget_on_each_automatic_re_run(team: Team, instant_waits: None) -> None:
    run = held_round(team, [ANSWERS["400"]] * 4, 3)
    r1 = task(run, "r1")
    assert (r1.status, r1.error_key, run.status) == ("failed", "provider_http_error", "needs_attention")
    assert TraceEvent.objects.filter(run=run, task_key="r1", event="auto_retry").count() == 3
    assert TraceEvent.objects.filter(run=run, task_key="r1", event="provider_call").count() == 4


@pytest.mark.spec("S26")
def test_it_still_refuses_to_renew_a_spent_route(team: Team, instant_waits: None) -> None:
    run = held_round(team, [ANSWERS["429"]] * 3 + [ANSWERS["200"]], 0)
    assert task(run, "r1").error_key == "attempt_budget_spent"
    with pytest.raises(Conflict) as refused:
        kernel.retry(run_id=run.pk, key="r1", user=team.users["operator"])
    assert refused.value.key == "model_route_spent"


def test_it_settles_a_round_whose_worker_meets_an_unexpected_exception(
    team: Team, instant_waits: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runs.worker import round_driver

    def broken(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a bug in the round driver")

    monkeypatch.setattr(round_driver, "_report_answer", broken)
    run = held_round(team, [ANSWERS["200"]], 3)
    r1 = task(run, "r1")
    assert (r1.status, r1.error_key, r1.claim) == ("failed", "error", None)
    assert run.status == "needs_attention"
    event = TraceEvent.objects.get(run=run, task_key="r1", to_status="failed")
    assert event.error["key"] == "error" and event.data == {"exception": "AssertionError"}
    # Not re-run blind by the retry budget: the same bug would meet it again.
    assert not TraceEvent.objects.filter(run=run, event="auto_retry").exists()
    from runs import failures

    assert failures.kind_for_error_key(r1.error_key) == "error"


def test_it_settles_a_tool_whose_report_meets_an_unexpected_exception(
    team: Team, instant_waits: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> bool:
        raise RuntimeError("the report could not be written")

    monkeypatch.setattr(kernel, "task_complete", broken)
    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={"tasks": [{"key": "s", "kind": "tool", "tool": "test.sleep", "args": {"seconds": 0}, "on_failure": "halt"}]},
    )
    run = drive(run)
    s = task(run, "s")
    assert (s.status, s.error_key, s.claim) == ("failed", "error", None)
    assert "RuntimeError" in (s.error_detail or "")
    assert run.status == "needs_attention"


def test_it_fails_a_call_whose_workers_keep_dying_instead_of_handing_it_on_forever(team: Team) -> None:
    from datetime import timedelta

    from django.conf import settings
    from django.utils import timezone

    from runs.kernel import MAX_EXPIRED_CLAIMS, sweep_expired_claims

    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={"tasks": [{"key": "r1", "kind": "round", "model": "script", "prompt": "go", "script": [ANSWERS["200"]]}]},
    )
    later = timezone.now()
    for lost in range(1, MAX_EXPIRED_CLAIMS + 1):
        r1 = task(run, "r1")
        assert (r1.status, r1.ready) == ("waiting", True), lost
        assert kernel.claim_task(None, r1.pk, f"worker-{lost}") is not None
        later += timedelta(seconds=settings.OZ0_LEASE_SECONDS + 1)
        sweep_expired_claims(later)
    r1 = task(run, "r1")
    assert (r1.status, r1.error_key, r1.claim) == ("failed", "error", None)
    assert f"{MAX_EXPIRED_CLAIMS} times" in (r1.error_detail or "")
    # A person's retry starts the count again, and a worker that reports ends the run.
    kernel.retry(run_id=run.pk, key="r1", user=team.users["operator"])
    assert "expired_claims" not in task(run, "r1").state
    run = drive(run)
    assert run.status == "completed"
