"""Digests delivered for real: SMTP into a local aiosmtpd sink, webhooks into a local receiver
whose signature check is the HMAC a Slack-compatible receiver would compute."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.utils import timezone

from notify import digests, subscriptions
from notify.models import Subscription
from notify.tasks import deliver_digest
from runs import kernel
from tenancy.models import Membership
from tests.conftest import Team
from tests.console.states import agent, approval_run, halted_run, question_run
from tests.notify.conftest import SmtpSink, WebhookReceiver

pytestmark = pytest.mark.django_db


@pytest.fixture
def later() -> Iterator[Any]:
    """Moves the clock forward (ticking) so the waits just made are past the digest's settle time."""
    travels: list[Any] = []

    def to(seconds: float) -> None:
        if travels:
            travels.pop().stop()
        traveller = time_machine.travel(timezone.now() + timedelta(seconds=seconds), tick=True)
        traveller.start()
        travels.append(traveller)

    yield to
    for traveller in travels:
        traveller.stop()


def subscribe(user: Any, team: Team, **fields: Any) -> tuple[Subscription, str]:
    body = {"workspace": team.slug, "kinds": ["approval", "question", "hold"], **fields}
    return subscriptions.create(user, body)


def run_sweep() -> list[int]:
    """What beat does: the sweep hands subscriptions out, a worker delivers each (here, eagerly)."""
    handed = digests.sweep(send=lambda pk: None)
    for pk in handed:
        deliver_digest.apply(args=[pk])
    return handed


def with_email(user: Any) -> Any:
    user.email = f"{user.username}@example.test"
    user.save(update_fields=["email"])
    return user


def verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, headers.get("x-oz0-signature", ""))


def test_two_waits_make_one_digest_and_the_next_interval_the_next(
    team: Team, smtp_sink: SmtpSink, webhook: WebhookReceiver, later: Any
) -> None:
    operator = with_email(team.users["operator"])
    sub, secret = subscribe(operator, team, email=True, webhook_url=webhook.url, interval_seconds=900)
    assert secret
    first = approval_run(team.workspace, operator, agent_name=agent("mailer", team.workspace))
    second = question_run(team.workspace, operator)
    later(10)

    assert run_sweep() == [sub.pk]
    assert len(smtp_sink.messages) == 1 and len(webhook.posts) == 1
    mail = smtp_sink.messages[0]
    assert smtp_sink.recipients == [[operator.email]]
    assert mail["Subject"] == f"oz0: 2 new waits on a person in {team.slug}"
    text = mail.get_content().replace("\r\n", "\n")
    assert f"http://oz0.test/runs/{first.id}/" in text and f"http://oz0.test/runs/{second.id}/" in text
    assert "- approval · agent mailer · task r1.1 · tool test.echo · waiting" in text
    assert "- question · task r1.1 · waiting" in text
    headers, body = webhook.posts[0]
    assert headers["content-type"] == "application/json"
    assert verify(secret, headers, body)
    assert not verify("someone-else's-secret", headers, body)
    chat = json.loads(body)["text"]
    # The same digest on both channels; in chat, what came from the run sits in code spans (issue 27).
    assert "- approval · agent `mailer` · task `r1.1 · tool test.echo` · waiting" in chat
    assert chat.replace("`", "") == text.rstrip("\n")

    # Within the interval: a new wait waits for the next digest.
    held = halted_run(team.workspace, operator)
    later(60)
    assert run_sweep() == []
    assert len(smtp_sink.messages) == 1 and len(webhook.posts) == 1

    later(16 * 60)
    assert run_sweep() == [sub.pk]
    assert len(smtp_sink.messages) == 2 and len(webhook.posts) == 2
    text = smtp_sink.messages[1].get_content()
    assert smtp_sink.messages[1]["Subject"] == f"oz0: 1 new wait on a person in {team.slug}"
    assert f"/runs/{held.id}/" in text and "- hold · task a · waiting" in text
    assert str(first.id) not in text and str(second.id) not in text
    assert verify(secret, *webhook.posts[1])
    sub.refresh_from_db()
    assert (sub.digests_sent, sub.consecutive_failures, sub.last_error, sub.queued_at) == (2, 0, "", None)

    # Nothing new: no message however long one waits.
    later(60 * 60)
    assert run_sweep() == []


@pytest.mark.spec("S9")
def test_keyed_client_awaits_never_notify(team: Team, webhook: WebhookReceiver, later: Any) -> None:
    operator = team.users["operator"]
    sub, _ = subscribe(operator, team, webhook_url=webhook.url, interval_seconds=300)
    run, receipt = kernel.create_run(
        workspace=team.workspace, user=operator, body={"tasks": [{"key": "q", "kind": "await", "question": "Ship it?"}]}
    )
    assert run.tasks.get(key="q").status == "dispatched"
    later(10)
    assert run_sweep() == []
    assert webhook.posts == []
    # The model's own question in the same workspace does notify.
    question_run(team.workspace, operator)
    later(20)
    assert run_sweep() == [sub.pk]
    assert len(webhook.posts) == 1 and str(run.id) not in webhook.texts()[0]


@pytest.mark.spec("F11", "F12")
def test_a_viewer_gets_kinds_and_links_never_the_words(team: Team, webhook: WebhookReceiver, later: Any) -> None:
    operator = team.users["operator"]
    viewer_sub, _ = subscribe(team.users["viewer"], team, webhook_url=webhook.url + "/viewer")
    reader_sub, _ = subscribe(team.users["reader"], team, webhook_url=webhook.url + "/reader")
    approval_run(team.workspace, operator, args={"path": "/etc/secret-args"})
    question_run(team.workspace, operator, question="Which secret region?")
    held = halted_run(team.workspace, operator, detail="boom: secret failure words")
    later(10)
    assert sorted(run_sweep()) == sorted([viewer_sub.pk, reader_sub.pk])
    assert len(webhook.posts) == 2
    viewer_text, reader_text = webhook.text_at("/viewer"), webhook.text_at("/reader")
    for word in ("secret-args", "secret region", "secret failure words"):
        assert word not in viewer_text
        assert word in reader_text
    assert "- hold" in viewer_text and "failure: tool_failed" in viewer_text and f"/runs/{held.id}/" in viewer_text
    assert "- approval" in viewer_text and "- question" in viewer_text


@pytest.mark.spec("F11", "F12")
def test_a_private_run_keeps_its_words_from_a_reader_who_did_not_create_it(
    team: Team, webhook: WebhookReceiver, later: Any
) -> None:
    subscribe(team.users["reader"], team, webhook_url=webhook.url, kinds=["approval"])
    approval_run(team.workspace, team.users["operator"], args={"token": "private-secret"}, private=True)
    later(10)
    run_sweep()
    assert len(webhook.posts) == 1
    assert "private-secret" not in webhook.texts()[0] and "- approval" in webhook.texts()[0]


def test_a_removed_member_gets_nothing(team: Team, webhook: WebhookReceiver, later: Any) -> None:
    reader = team.users["reader"]
    sub, _ = subscribe(reader, team, webhook_url=webhook.url)
    approval_run(team.workspace, team.users["operator"])
    Membership.objects.filter(user=reader, workspace=team.workspace).delete()
    later(10)
    assert run_sweep() == [sub.pk]
    assert webhook.posts == []
    sub.refresh_from_db()
    assert sub.last_error == "not a member of the workspace: nothing sent" and sub.digests_sent == 0


def test_an_agent_filter_and_kinds_narrow_the_digest(team: Team, webhook: WebhookReceiver, later: Any) -> None:
    operator = team.users["operator"]
    subscribe(operator, team, webhook_url=webhook.url, kinds=["approval"], agent=agent("wanted", team.workspace))
    approval_run(team.workspace, operator, agent_name=agent("other", team.workspace))
    question_run(team.workspace, operator)
    later(10)
    assert run_sweep() == []
    wanted = approval_run(team.workspace, operator, agent_name="wanted")
    later(20)
    run_sweep()
    assert len(webhook.posts) == 1 and f"/runs/{wanted.id}/" in webhook.texts()[0]
    assert "- question" not in webhook.texts()[0]


def test_a_failed_delivery_is_recorded_and_retried_until_it_goes_out(team: Team, webhook: WebhookReceiver, later: Any) -> None:
    sub, secret = subscribe(team.users["operator"], team, webhook_url=webhook.url)
    approval_run(team.workspace, team.users["operator"])
    webhook.answers = [500, 503]
    later(10)
    assert run_sweep() == [sub.pk]
    # Celery retried twice after the two refusals; the third attempt went out.
    assert len(webhook.posts) == 3
    # The same waits, each told with its age when that attempt went out.
    first, last = (re.sub(r"waiting \d+ s\b", "waiting N s", text) for text in (webhook.texts()[0], webhook.texts()[2]))
    assert first == last
    assert verify(secret, *webhook.posts[2])
    sub.refresh_from_db()
    assert (sub.consecutive_failures, sub.last_error, sub.digests_sent, sub.queued_at) == (0, "", 1, None)


def test_a_delivery_that_keeps_failing_shows_on_the_subscription(team: Team, webhook: WebhookReceiver, later: Any) -> None:
    sub, _ = subscribe(team.users["operator"], team, webhook_url=webhook.url)
    approval_run(team.workspace, team.users["operator"])
    webhook.answers = [500] * 10
    later(10)
    watermark = Subscription.objects.get(pk=sub.pk).watermark
    assert run_sweep() == [sub.pk]
    attempts = 1 + deliver_digest.max_retries
    assert len(webhook.posts) == attempts
    sub.refresh_from_db()
    assert sub.consecutive_failures == attempts
    assert sub.last_error == "webhook: answered HTTP 500"
    assert sub.last_attempt_at is not None and sub.last_digest_at is None and sub.digests_sent == 0
    # The waits stay news, and the sweep does not hand the subscription out again while its
    # delivery is pending; after the requeue horizon it does, and a healthy receiver gets them.
    assert sub.watermark == watermark
    assert run_sweep() == []
    later(10 + digests.REQUEUE.total_seconds() + 1)
    webhook.answers = []
    assert run_sweep() == [sub.pk]
    sub.refresh_from_db()
    assert (sub.consecutive_failures, sub.last_error, sub.digests_sent) == (0, "", 1)
    doc = subscriptions.document(sub)
    assert doc["status"] == "ok"


def test_an_unreachable_smtp_server_is_a_recorded_failure(team: Team, settings: Any, later: Any) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", 9, 2
    operator = with_email(team.users["operator"])
    sub, _ = subscribe(operator, team, email=True)
    approval_run(team.workspace, operator)
    later(10)
    with pytest.raises(Exception, match="e-mail: ConnectionRefusedError"):
        digests.sweep(send=lambda pk: digests.deliver(pk))
    sub.refresh_from_db()
    assert sub.last_error == "e-mail: ConnectionRefusedError" and sub.consecutive_failures == 1


def test_a_webhook_that_resolves_to_a_private_address_is_refused_at_send_time(
    team: Team, webhook: WebhookReceiver, settings: Any, later: Any
) -> None:
    sub, _ = subscribe(team.users["operator"], team, webhook_url=webhook.url)
    approval_run(team.workspace, team.users["operator"])
    settings.OZ0_NOTIFY_PRIVATE_WEBHOOKS = False
    later(10)
    run_sweep()
    assert webhook.posts == []
    sub.refresh_from_db()
    assert sub.last_error == "webhook: the host resolves to a private address (refused)"


def test_beat_runs_the_sweep_and_the_sweep_queues_deliveries(
    team: Team, webhook: WebhookReceiver, settings: Any, later: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from notify import tasks
    from oz0site.celery import app

    entry = settings.CELERY_BEAT_SCHEDULE["notify-sweep"]
    app.loader.import_default_modules()
    assert entry["task"] in app.tasks and tasks.deliver_digest.name in app.tasks
    sent: list[int] = []
    monkeypatch.setattr(tasks.deliver_digest, "delay", sent.append)
    sub, _ = subscribe(team.users["operator"], team, webhook_url=webhook.url)
    approval_run(team.workspace, team.users["operator"])
    later(10)
    tasks.sweep()
    assert sent == [sub.pk]
    tasks.sweep()
    assert sent == [sub.pk]
