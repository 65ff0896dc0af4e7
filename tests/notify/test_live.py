"""End to end on the live stack: beat runs notify's sweep, a real Celery worker delivers the digest
(by the console e-mail backend, the default), and the subscription shows it."""

from __future__ import annotations

import pytest

from notify import subscriptions
from notify.models import Subscription
from tests.conftest import Team, wait_for
from tests.console.states import approval_run

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("committed")]


def test_beat_and_a_worker_deliver_a_digest(live_team: Team, no_dispatch: list[int]) -> None:
    operator = live_team.users["operator"]
    operator.email = "operator@example.test"
    operator.save(update_fields=["email"])
    row, _ = subscriptions.create(operator, {"workspace": live_team.slug, "kinds": ["approval"], "email": True})
    approval_run(live_team.workspace, operator)
    # Beat's notify sweep runs every 30 s; the worker's delivery follows it.
    delivered = wait_for(
        lambda: Subscription.objects.filter(pk=row.pk, digests_sent=1).first(), timeout=90, message="a digest delivered"
    )
    assert delivered.last_error == "" and delivered.last_digest_at is not None and delivered.queued_at is None
