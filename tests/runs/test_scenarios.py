"""Every conformance scenario, driven through the JSON API on the live stack."""

from __future__ import annotations

import pytest

from tests.conftest import Team
from tests.scenario import ScenarioRun
from tests.scenario_data import SCENARIOS

pytestmark = pytest.mark.live


@pytest.mark.parametrize(
    "scenario_id",
    [pytest.param(name, marks=pytest.mark.spec(*scenario["spec"]), id=name) for name, scenario in SCENARIOS.items()],
)
def test_it_passes_the_scenario(scenario_id: str, live_team: Team) -> None:
    ScenarioRun(live_team, SCENARIOS[scenario_id]["steps"]).play()
