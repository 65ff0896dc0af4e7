"""F11, F12 on the digest: secrets planted in every place a run keeps words (the insights
redaction walk's planting) never reach a subscriber the content is closed to, while the
operator who made the runs finds the waiting words in theirs (so the secrets were reachable)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from notify import subscriptions
from oz0site import realtime
from runs import kernel
from tests.conftest import Team
from tests.insights.planting import plant
from tests.notify.conftest import WebhookReceiver
from tests.notify.test_delivery import later, run_sweep  # noqa: F401 - the clock fixture

pytestmark = pytest.mark.django_db


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(realtime, "publish", lambda groups, payload: None)
    previous = kernel.install_sender(lambda ids, chunks, run_id, sessions, priority=5: None)
    yield
    kernel.install_sender(previous)


@pytest.mark.spec("F11", "F12")
def test_a_digest_carries_no_word_a_subscriber_may_not_read(
    team: Team,
    webhook: WebhookReceiver,
    later: Any,  # noqa: F811
    in_process: None,
    django_capture_on_commit_callbacks: Any,
) -> None:
    for role in ("operator", "reader", "viewer"):
        subscriptions.create(
            team.users[role],
            {"workspace": team.slug, "kinds": ["approval", "question", "hold"], "webhook_url": f"{webhook.url}/{role}"},
        )
    with django_capture_on_commit_callbacks(execute=True):
        public = plant(team, private=False, tag="PUB")
        private = plant(team, private=True, tag="PRIV")
    later(10)
    assert len(run_sweep()) == 3
    operator, reader, viewer = (webhook.text_at(f"/{role}") for role in ("operator", "reader", "viewer"))

    def found(text: str, secrets: dict[str, str]) -> set[str]:
        return {what for what, secret in secrets.items() if secret in text}

    assert found(viewer, public.secrets) == set() and found(viewer, private.secrets) == set()
    assert found(reader, private.secrets) == set()
    # What waits carries words: the creator reads them in both runs' digests, a reader in the public ones.
    assert {"pending_args", "tool_error"} <= found(operator, public.secrets) & found(reader, public.secrets)
    assert {"pending_args", "tool_error"} <= found(operator, private.secrets)
