"""S16: a halt loser absorbed by a settled any|quorum barrier shows `failure_resolution: absorbed`
in the run document (API.md), whatever order the race meets its consumers in."""

from __future__ import annotations

from typing import Any

import pytest

from runs import kernel
from runs.models import Run
from runs.selectors import candidates
from tests.conftest import Team
from tests.runs.driver import drive, echo, fail, join


def create(team: Team, tasks: list[dict[str, Any]], deliverable: str) -> Run:
    run, _ = kernel.create_run(
        workspace=team.workspace, user=team.users["operator"], body={"tasks": tasks, "deliverable": deliverable}
    )
    return drive(run)


def documented(team: Team, run: Run) -> dict[str, dict[str, Any]]:
    status, doc = team.api("reader").get(f"/runs/{run.pk}")
    assert status == 200
    return {t["key"]: t for t in doc["tasks"]}


@pytest.mark.spec("S15", "S16")
def test_it_absorbs_a_halt_loser_whose_other_consumer_the_race_cancels_later(team: Team) -> None:
    # The loser feeds the barrier directly and through `x`; the race looks at the loser before it
    # cancels `x`, and must come back to it once `x` is canceled.
    run = create(
        team,
        [
            fail("loser", on_failure="halt"),
            echo("x", after=["loser"]),
            echo("winner"),
            join("j", ["loser", "x", "winner"], "any"),
        ],
        "j",
    )
    tasks = documented(team, run)
    assert tasks["x"]["status"] == "canceled" and tasks["x"]["error"]["key"] == "join_loser_canceled"
    assert tasks["loser"]["status"] == "failed" and tasks["loser"]["failure_resolution"] == "absorbed"
    assert candidates(run) == []
    assert run.status == "completed"


@pytest.mark.spec("S16")
def test_it_absorbs_a_halt_loser_of_a_settled_quorum(team: Team) -> None:
    run = create(
        team,
        [
            fail("loser", on_failure="halt"),
            echo("a"),
            echo("b"),
            echo("x", after=["loser"]),
            join("j", ["loser", "x", "a", "b"], "quorum", 2),
        ],
        "j",
    )
    tasks = documented(team, run)
    assert tasks["loser"]["failure_resolution"] == "absorbed"
    assert run.status == "completed"
