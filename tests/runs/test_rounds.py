"""Model rounds on the script provider, driven in-process: fallbacks, spent routes, compaction (S23-S28)."""

from __future__ import annotations

from typing import Any

import pytest

from runs import kernel
from runs.kernel import Conflict
from runs.models import Run, TraceEvent
from tests.conftest import Team
from tests.runs.driver import drive, statuses, task


def create(team: Team, round_: dict[str, Any], **body: Any) -> Run:
    spec = {"key": "r1", "kind": "round", "model": "script:main", "prompt": "go", **round_}
    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={"tasks": [spec], "deliverable": "r1", "approval": {"mode": "bypass"}, **body},
    )
    return drive(run)


@pytest.mark.spec("S25", "S27")
def test_it_stays_on_the_fallback_for_the_rest_of_the_turn(team: Team) -> None:
    script = {
        "script:main": [{"refusal": "classifier", "category": "cyber"}, {"text": "main must not answer again"}],
        "script:backup": [{"tool_calls": [{"tool": "test.echo", "args": {"value": 1}}]}, {"text": "backup finished the turn"}],
    }
    run = create(team, {"script": script, "fallback_models": ["script:backup"]})
    assert run.status == "completed" and run.output == "backup finished the turn"
    r1 = task(run, "r1")
    assert r1.result["model_change"] == {
        "from": "script:main",
        "to": "script:backup",
        "reason": "model_refused",
        "category": "cyber",
    }
    routes = [e.data["route"] for e in TraceEvent.objects.filter(run=run, event="provider_call").order_by("seq")]
    assert routes == ["script:main", "script:backup", "script:backup"]


@pytest.mark.spec("S25", "S26")
def test_it_refuses_a_manual_retry_of_a_spent_route(team: Team) -> None:
    script = {"script:main": [{"http": 529}] * 3}
    run = create(team, {"script": script, "on_failure": "halt"})
    r1 = task(run, "r1")
    assert (r1.status, r1.error_key) == ("failed", "provider_overloaded")
    assert run.status == "needs_attention"
    with pytest.raises(Conflict) as refused:
        kernel.retry(run_id=run.pk, key="r1", user=team.users["operator"])
    assert refused.value.key == "model_route_spent"
    # A refused retry changes nothing.
    assert task(run, "r1").status == "failed"


@pytest.mark.spec("S26")
def test_it_counts_mixed_transient_failures_as_exhaustion_not_overload(team: Team) -> None:
    script = {"script:main": [{"http": 529}, {"http": 500}, {"http": 529}], "script:backup": [{"text": "never"}]}
    run = create(team, {"script": script, "fallback_models": ["script:backup"], "on_failure": "halt"})
    assert task(run, "r1").error_key == "provider_transient_exhausted"
    assert "model_change" not in (task(run, "r1").result or {})


@pytest.mark.spec("S24")
def test_it_bills_a_refused_round(team: Team) -> None:
    run = create(team, {"script": {"script:main": [{"refusal": "blocked"}]}, "on_failure": "halt"})
    r1 = task(run, "r1")
    assert r1.error_key == "model_refused" and r1.result["usage"]["calls"] == 1


@pytest.mark.spec("S23")
def test_it_compacts_a_round_that_overflows_with_history(team: Team) -> None:
    script = [
        {"tool_calls": [{"tool": "test.echo", "args": {"value": 1}}]},
        {"context_overflow": True},
        {"text": "after compaction"},
    ]
    run = create(team, {"model": "script", "script": script})
    assert run.status == "completed" and run.output == "after compaction"
    kinds = {t.key: t.kind for t in run.tasks.all()}
    assert kinds == {"r1": "round", "r1.1": "tool", "r1.2": "summarizer"}


@pytest.mark.spec("S23")
def test_it_fails_an_overflow_with_nothing_to_summarize(team: Team) -> None:
    run = create(team, {"model": "script", "script": [{"context_overflow": True}], "on_failure": "halt"})
    assert task(run, "r1").error_key == "provider_context_overflow"
    with pytest.raises(Conflict) as refused:
        kernel.compact(run_id=run.pk, key="r1", user=team.users["operator"])
    assert refused.value.key == "not_a_candidate"


@pytest.mark.spec("S14", "S23")
def test_it_compacts_a_failed_round_on_a_persons_word(team: Team) -> None:
    script = [
        {"tool_calls": [{"tool": "test.echo", "args": {"value": 1}}]},
        {"finish": "error", "word": "garbled"},
        {"text": "repaired"},
    ]
    run = create(team, {"model": "script", "script": script, "on_failure": "halt"})
    assert task(run, "r1").error_key == "provider_error" and run.status == "needs_attention"
    kernel.compact(run_id=run.pk, key="r1", user=team.users["operator"])
    run = drive(run)
    assert run.status == "completed" and run.output == "repaired"
    assert statuses(run)["r1.2"] == "completed"


@pytest.mark.spec("F6")
def test_it_refuses_an_oz_fail_message_over_two_thousand_characters(team: Team) -> None:
    script = [{"oz_fail": {"kind": "not_found", "message": "x" * 2001}}]
    run = create(team, {"model": "script", "script": script, "on_failure": "halt", "tools": ["oz.fail"]})
    assert task(run, "r1").error_key == "round_expansion_refused"
    assert "2001 characters" in (task(run, "r1").error_detail or "")
    # The run holds on the refused round (kind model), never on the kind the agent asked for.
    assert run.status == "needs_attention" and run.failure is not None
    assert (run.failure["kind"], run.failure["declared"]) == ("model", False)
