"""Failure policies, joins and holds, driven through the kernel in-process (no Celery)."""

from __future__ import annotations

from typing import Any

import pytest

from runs import kernel
from runs.kernel import Conflict
from runs.models import Run
from tests.conftest import Team
from tests.runs.driver import drive, echo, fail, join, statuses, task


def create(team: Team, tasks: list[dict[str, Any]], deliverable: str, **body: Any) -> Run:
    run, _ = kernel.create_run(
        workspace=team.workspace, user=team.users["operator"], body={"tasks": tasks, "deliverable": deliverable, **body}
    )
    return run


@pytest.mark.spec("S3", "S29")
def test_it_completes_a_chain_with_the_deliverables_value(team: Team) -> None:
    run = drive(create(team, [echo("a", 1), echo("b", 2, after=["a"])], "b"))
    assert run.status == "completed"
    assert run.output == 2
    assert run.attention is None


@pytest.mark.spec("S3")
def test_it_keeps_a_dependent_waiting_until_its_source_settles(team: Team) -> None:
    run = create(team, [echo("a"), echo("b", after=["a"])], "b")
    assert statuses(run) == {"a": "waiting", "b": "waiting"}
    assert task(run, "a").ready and not task(run, "b").ready


@pytest.mark.spec("S11", "S18")
def test_it_skips_descendants_transitively_on_propagate(team: Team) -> None:
    run = drive(create(team, [fail("a"), echo("b", after=["a"]), echo("c", after=["b"]), echo("d")], "c"))
    assert statuses(run) == {"a": "failed", "b": "skipped", "c": "skipped", "d": "completed"}
    assert run.status == "needs_attention"
    assert run.attention == {"reason": "deliverable_unresolved", "blocked_task_keys": ["c"], "kinds": ["tool_failed"]}
    assert task(run, "c").skipped_by == "a"


@pytest.mark.spec("S11", "S18")
def test_it_does_not_hold_a_run_whose_deliverable_completed_for_a_failure_off_its_path(team: Team) -> None:
    run = drive(create(team, [fail("a"), echo("b", after=["a"]), echo("d", 4)], "d"))
    assert run.status == "completed"
    assert run.output == 4


@pytest.mark.spec("S12", "S15")
def test_it_absorbs_a_failure_and_runs_its_dependents(team: Team) -> None:
    run = drive(create(team, [fail("a", on_failure="absorb"), echo("b", 7, after=["a"])], "b"))
    assert run.status == "completed" and run.output == 7
    a = task(run, "a")
    assert a.status == "failed" and a.failure_resolution == "absorbed"
    for verb in (kernel.retry, kernel.abandon):
        with pytest.raises(Conflict) as refused:
            verb(run_id=run.pk, key="a", user=team.users["operator"])
        assert refused.value.key in ("run_finished", "not_a_candidate")


@pytest.mark.spec("S12", "S15")
def test_it_refuses_verbs_on_an_absorbed_failure_while_the_run_is_open(team: Team) -> None:
    run = drive(create(team, [fail("a", on_failure="absorb"), fail("h", on_failure="halt"), echo("b", after=["a", "h"])], "b"))
    assert run.status == "needs_attention"
    with pytest.raises(Conflict) as refused:
        kernel.retry(run_id=run.pk, key="a", user=team.users["operator"])
    assert refused.value.key == "not_a_candidate"


@pytest.mark.spec("S13", "S21")
def test_it_finishes_what_can_run_then_holds_on_halt(team: Team) -> None:
    run = drive(create(team, [fail("a", on_failure="halt"), echo("b"), echo("c", after=["a"])], "c"))
    assert statuses(run) == {"a": "failed", "b": "completed", "c": "waiting"}
    assert run.status == "needs_attention"
    assert run.attention == {"reason": "halt_failure", "blocked_task_keys": ["a"], "kinds": ["tool_failed"]}
    assert run.held_since is not None


@pytest.mark.spec("S13", "S19")
def test_it_keeps_a_hold_with_no_clock(team: Team) -> None:
    from runs.kernel import sweep_clocks, sweep_expired_claims

    run = drive(create(team, [fail("a", on_failure="halt"), echo("c", after=["a"])], "c"))
    from datetime import timedelta

    from django.utils import timezone

    far = timezone.now() + timedelta(days=400)
    sweep_clocks(far)
    sweep_expired_claims(far)
    run.refresh_from_db()
    assert run.status == "needs_attention"


@pytest.mark.spec("S11", "S16")
def test_it_counts_a_skipped_source_as_a_non_success_for_quorum(team: Team) -> None:
    run = drive(create(team, [fail("a"), echo("b"), echo("c"), join("j", ["a", "b", "c"], "quorum", 2)], "j"))
    assert task(run, "j").status == "completed"
    assert run.status == "completed"


@pytest.mark.spec("S11", "S18")
def test_it_skips_an_all_join_with_a_skipped_source(team: Team) -> None:
    run = drive(create(team, [fail("a"), echo("b"), join("j", ["a", "b"])], "j"))
    assert task(run, "j").status == "skipped"
    assert run.attention["reason"] == "deliverable_unresolved"


@pytest.mark.spec("S11")
def test_it_skips_an_any_join_when_every_source_fails(team: Team) -> None:
    run = drive(create(team, [fail("a"), fail("b"), join("j", ["a", "b"], "any")], "j"))
    assert task(run, "j").status == "skipped"


@pytest.mark.spec("S16")
def test_it_cancels_join_losers_nobody_else_needs(team: Team) -> None:
    run = create(
        team,
        [
            echo("fast"),
            echo("slow", after=["gate"]),
            {"key": "gate", "kind": "await", "question": "?"},
            join("j", ["fast", "slow"], "any"),
        ],
        "j",
    )
    run = drive(run)
    assert statuses(run)["slow"] == "canceled"
    assert task(run, "slow").error_key == "join_loser_canceled"
    # The loser's own unfinished source had no other consumer: the race canceled it too.
    assert statuses(run)["gate"] == "canceled"
    assert run.status == "completed"


@pytest.mark.spec("S16")
def test_it_keeps_a_loser_that_another_unfinished_task_consumes(team: Team) -> None:
    run = create(
        team,
        [
            echo("fast"),
            {"key": "gate", "kind": "await", "question": "?"},
            echo("slow", after=["gate"]),
            join("j", ["fast", "slow"], "any"),
            echo("other", after=["slow"]),
        ],
        "other",
    )
    run = drive(run)
    assert statuses(run)["slow"] == "waiting"
    assert statuses(run)["j"] == "completed"


@pytest.mark.spec("S15", "S16")
def test_it_absorbs_a_halt_loser_of_a_settled_race(team: Team) -> None:
    run = drive(create(team, [fail("loser", on_failure="halt"), echo("winner"), join("j", ["loser", "winner"], "any")], "j"))
    assert run.status == "completed"
    assert task(run, "loser").failure_resolution == "absorbed"
    from runs.selectors import candidates

    assert candidates(run) == []


@pytest.mark.spec("S16")
def test_it_holds_on_a_halt_loser_that_still_has_an_unfinished_consumer(team: Team) -> None:
    run = drive(
        create(
            team,
            [
                fail("loser", on_failure="halt"),
                echo("winner"),
                join("j", ["loser", "winner"], "any"),
                echo("after", after=["loser"]),
            ],
            "j",
        )
    )
    assert run.status == "needs_attention"
    assert run.attention == {"reason": "halt_failure", "blocked_task_keys": ["loser"], "kinds": ["tool_failed"]}


@pytest.mark.spec("S17")
def test_it_releases_a_hold_on_append_and_re_holds_when_the_repair_cannot_resolve(team: Team) -> None:
    operator = team.users["operator"]
    run = drive(create(team, [fail("a"), echo("c", after=["a"])], "c"))
    assert run.status == "needs_attention"
    run, _ = kernel.append(run_id=run.pk, user=operator, body={"tasks": [fail("fix")], "deliverable": "fix"})
    assert run.status == "running"
    run = drive(run)
    assert run.status == "needs_attention" and run.attention["blocked_task_keys"] == ["fix"]
    run, _ = kernel.append(run_id=run.pk, user=operator, body={"tasks": [echo("fix2", 42)], "deliverable": "fix2"})
    run = drive(run)
    assert run.status == "completed" and run.output == 42


@pytest.mark.spec("S29")
def test_it_refuses_appends_to_a_finished_run(team: Team) -> None:
    run = drive(create(team, [echo("a")], "a"))
    with pytest.raises(Conflict) as refused:
        kernel.append(run_id=run.pk, user=team.users["operator"], body={"tasks": [echo("b")]})
    assert refused.value.key == "run_finished"


@pytest.mark.spec("S2")
def test_it_never_runs_a_join(team: Team) -> None:
    run = drive(create(team, [echo("a"), echo("b"), join("j", ["a", "b"])], "j"))
    from runs.models import TraceEvent

    assert not TraceEvent.objects.filter(run=run, task_key="j", to_status="running").exists()
    assert task(run, "j").result == {"value": {"a": 1, "b": 1}}


@pytest.mark.spec("S1", "S22")
def test_it_uses_only_the_seeds_statuses_and_error_keys(team: Team) -> None:
    from runs import failures
    from runs.models import TaskStatus

    assert {s.value for s in TaskStatus} == {
        "waiting",
        "needs_approval",
        "running",
        "dispatched",
        "awaiting_input",
        "completed",
        "failed",
        "canceled",
        "timed_out",
        "uncertain",
        "skipped",
    }
    seed_keys = {
        "provider_http_error",
        "provider_model_unavailable",
        "provider_context_overflow",
        "context_overflow",
        "missing_input",
        "input_source_unavailable",
        "round_expansion_refused",
        "provider_error",
        "model_refused",
        "provider_overloaded",
        "provider_transient_exhausted",
        "model_route_spent",
        "attempt_budget_spent",
        "model_capability_unavailable",
        "tool_failed",
        "tool_timeout",
        "tool_uncertain",
        "await_failed",
        "await_timeout",
        "executor_revoked",
        "run_canceled",
    }
    assert seed_keys <= set(failures.ERROR_KEYS)
    assert all(failures.kind_for_error_key(k) in failures.PLATFORM_KINDS for k in seed_keys)
