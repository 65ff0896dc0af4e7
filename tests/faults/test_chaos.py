"""The whole of it under load, one fault at a time (bench/chaos.py; `./oz0 bench --only chaos`
measures the same on production's clocks): about 20 runs of 23 tasks per fault, calls in flight,
non-replayable `test.effect` calls among them, creates and approvals made during the fault.

For every fault: nothing lost, nothing duplicated, no false failure, nothing stuck, no 5xx for a
request that committed, every expired lease acted on within the lease plus two sweep periods."""

from __future__ import annotations

import pytest

from bench.chaos import FAULTS, markdown, run_faults
from bench.chaos_stack import Stack
from tests.faults.conftest import PROFILE

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(1500)]


@pytest.mark.spec("S10", "S29")
def test_faults_one_at_a_time_lose_nothing_and_run_nothing_twice(stack: Stack) -> None:
    results = run_faults(PROFILE, stack=stack)
    print("\n" + markdown(results, PROFILE))
    assert [r.fault.split(" (")[0] for r in results] == [f.title for f in FAULTS]
    problems = {r.fault: r.problems() + r.notes for r in results if r.problems()}
    assert not problems, problems
    for result in results:
        assert result.completed + result.waiting_for_person == result.runs == PROFILE.runs, result
    # Where a holder died or stopped, its non-replayable call waits for a person, and only there.
    holders_die = {f.title for f in FAULTS if f.holders_die}
    for result in results:
        if result.fault.split(" (")[0] not in holders_die:
            assert result.waiting_for_person == 0, result
