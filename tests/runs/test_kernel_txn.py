"""The kernel's unit of work writes a transaction's trace events before its run row: the insights
repairs trigger (on the trace insert) reads the run's `held_since` as it stood before the repair
released the hold."""

from __future__ import annotations

import pytest

from insights.models import RepairDaily
from runs import kernel
from runs.kernel import commit as kernel_commit
from runs.kernel.txn import Txn
from runs.models import Run, Task
from tests.conftest import Team
from tests.runs.driver import drive, fail


def held_run(team: Team) -> Run:
    run, _ = kernel.create_run(
        workspace=team.workspace, user=team.users["operator"], body={"tasks": [fail("a", on_failure="halt")], "deliverable": "a"}
    )
    # The repairs rollup counts agents' runs; the name is all the trigger reads of the agent.
    Run.objects.filter(pk=run.pk).update(agent_name="txn-order")
    run = drive(run)
    assert run.status == "needs_attention" and run.held_since is not None
    return run


def held_repairs() -> list[int]:
    return list(RepairDaily.objects.filter(agent_name="txn-order").values_list("held", flat=True))


def test_it_inserts_the_trace_before_it_saves_the_run(team: Team) -> None:
    run = held_run(team)
    kernel.retry(run_id=run.pk, key="a", user=team.users["operator"])
    assert held_repairs() == [1], "the repair that released the hold is counted as held"


def test_the_order_matters_to_the_repairs_trigger(team: Team, monkeypatch: pytest.MonkeyPatch) -> None:
    def run_first(txn: Txn) -> None:
        if txn.run_fields:
            txn.run.save(update_fields=[*sorted(txn.run_fields), "updated_at"])
        kernel_commit.insert_trace(txn.run.pk, txn.events)

    run = held_run(team)
    monkeypatch.setattr(kernel_commit, "write_trace_then_run", run_first)
    kernel.retry(run_id=run.pk, key="a", user=team.users["operator"])
    assert held_repairs() == [0], "saved first, the run row hides the hold from the trigger"


def test_a_move_to_completed_is_refused() -> None:
    """A task completes through Txn.complete only, which chooses its statement (per row, or one
    for a chunk) and records either alike."""
    txn = Txn(run=Run(), actor="test")
    with pytest.raises(ValueError, match="one completion path"):
        txn.move(Task(key="a", status="running"), "completed")
    with pytest.raises(ValueError, match="one completion path"):
        txn.move_many([Task(key="a", status="running")], "completed")
