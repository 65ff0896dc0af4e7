"""JSON has one number type: where the OpenAPI document says `integer`, 2.0 is the whole number 2
(JSON Schema reads it so), and the server takes it as 2; 2.5, true and "2" stay refused. The
OpenAPI fuzz found an eval's `version` of 190.0 refused as `invalid_version`; the same strict check
was in five more places."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from notify.subscriptions import create as create_subscription
from oz0agents.rollouts import checked_percent
from runs.kernel import InvalidRequest
from schedules.timing import check_interval, min_interval_seconds
from tenancy.approvers import DeadlinesRefused, checked_seconds
from tests.conftest import Team


@pytest.mark.parametrize("refused", [2.5, True, "2", "", float("inf")])
def test_each_whole_number_check_takes_a_whole_float_as_its_int_and_refuses_the_rest(refused: Any) -> None:
    low = min_interval_seconds()
    accepted = [
        (check_interval, float(low), low),
        (checked_percent, 10.0, 10),
        (partial(checked_seconds, "ask_seconds"), 60.0, 60),
    ]
    for check, whole, expected in accepted:
        answer = check(whole)
        assert answer == expected and type(answer) is int, (whole, answer)
        with pytest.raises((InvalidRequest, DeadlinesRefused)):
            check(refused)


def test_an_eval_of_version_two_point_zero_is_version_two(team: Team, no_dispatch: list[int]) -> None:
    status, answer = team.api().post(f"/workspaces/{team.slug}/evals", {"agent": "missing", "version": 2.0})
    assert (status, answer["error"]["key"]) != (400, "invalid_version"), answer
    status, answer = team.api().post(f"/workspaces/{team.slug}/evals", {"agent": "missing", "version": 2.5})
    assert (status, answer["error"]["key"]) == (400, "invalid_version"), answer


def test_a_subscription_interval_of_a_whole_float_is_kept_as_its_seconds(team: Team) -> None:
    reader = team.users["reader"]
    reader.email = "reader@example.com"
    reader.save(update_fields=["email"])
    subscription, _ = create_subscription(
        reader, {"workspace": team.slug, "kinds": ["question"], "email": True, "interval_seconds": 1800.0}
    )
    subscription.refresh_from_db()
    assert subscription.interval_seconds == 1800
