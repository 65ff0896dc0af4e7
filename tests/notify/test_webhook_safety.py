"""A webhook cannot be aimed inside the deployment (IPv4 hidden in IPv6, a name that rebinds), and
what a model wrote cannot mention a channel or disguise a link in the chat it lands in (issue 27)."""

from __future__ import annotations

import json
import socket
from datetime import timedelta
from typing import Any

import httpx
import pytest
import time_machine
from django.utils import timezone

from notify import delivery, digests, subscriptions
from notify.delivery import DeliveryError
from tests.conftest import Team
from tests.console.states import approval_run, halted_run, question_run

pytestmark = pytest.mark.django_db

EMBEDDED_PRIVATE = [
    "::127.0.0.1",  # IPv4-compatible (::/96)
    "::a9fe:a9fe",  # ::169.254.169.254, a cloud's metadata endpoint
    "64:ff9b::7f00:1",  # NAT64 well-known prefix
    "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
    "64:ff9b:1::a00:1",  # NAT64 for local use
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    "2002:c0a8:101::",  # 6to4 of 192.168.1.1
    "::ffff:127.0.0.1",  # IPv4-mapped
    "::ffff:0:7f00:1",  # IPv4-translated
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
]


@pytest.mark.parametrize("address", EMBEDDED_PRIVATE)
def test_it_refuses_a_url_whose_ipv6_address_embeds_a_private_ipv4_one(team: Team, address: str) -> None:
    code, doc = team.api("operator").post(
        "/subscriptions", {"workspace": team.slug, "kinds": ["approval"], "webhook_url": f"http://[{address}]:8765/hook"}
    )
    assert (code, doc["error"]["key"]) == (400, "private_webhook_url"), doc


@pytest.mark.parametrize("address", ["::8.8.8.8", "64:ff9b::808:808", "2002:808:808::1", "2606:4700:4700::1111"])
def test_it_judges_an_embedded_public_ipv4_address_public(address: str) -> None:
    assert not subscriptions.is_private_address(address)


class Resolver:
    """A fake DNS: answers each look-up of a name with the next of its answers (the last one repeats)."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.lookups = 0

    def __call__(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        answer = self.answers[min(self.lookups, len(self.answers) - 1)]
        self.lookups += 1
        family = socket.AF_INET6 if ":" in answer else socket.AF_INET
        sockaddr = (answer, port, 0, 0) if family == socket.AF_INET6 else (answer, port)
        return [(family, socket.SOCK_STREAM, 6, "", sockaddr)]


class Recorder:
    """Stands in for the network: records what the client would have sent and where."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    def transport(self) -> httpx.MockTransport:
        def answer(request: httpx.Request) -> httpx.Response:
            self.requests.append(request)
            return httpx.Response(200, text="ok")

        return httpx.MockTransport(answer)


@pytest.fixture
def network(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Recorder:
    settings.OZ0_NOTIFY_PRIVATE_WEBHOOKS = False
    recorder = Recorder()
    monkeypatch.setattr(delivery, "_transport", recorder.transport)
    return recorder


@pytest.mark.parametrize("address", ["::127.0.0.1", "64:ff9b::a9fe:a9fe", "2002:a00:1::"])
def test_it_refuses_at_send_time_a_name_that_resolves_to_an_embedded_private_address(
    network: Recorder, monkeypatch: pytest.MonkeyPatch, address: str
) -> None:
    monkeypatch.setattr(socket, "getaddrinfo", Resolver(address))
    with pytest.raises(DeliveryError, match="private address"):
        delivery.post_webhook("https://hooks.example.com/T0/B0/x", "s3cret", "hello")
    assert network.requests == []


def test_it_connects_to_the_address_it_vetted_when_the_name_rebinds(network: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    """The name answers a public address to the check and 127.0.0.1 to anyone who asks again."""
    resolver = Resolver("93.184.216.34", "127.0.0.1")
    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    delivery.post_webhook("https://hooks.example.com:8443/T0/B0/x", "s3cret", "hello")
    [request] = network.requests
    assert resolver.lookups == 1
    assert (request.url.scheme, request.url.host, request.url.port) == ("https", "93.184.216.34", 8443)
    assert request.url.path == "/T0/B0/x"
    assert request.headers["host"] == "hooks.example.com:8443"
    assert request.extensions["sni_hostname"] == "hooks.example.com"
    assert request.headers[delivery.SIGNATURE_HEADER] == delivery.signature("s3cret", request.content)


def test_it_pins_an_ipv6_address_in_brackets(network: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "getaddrinfo", Resolver("2606:4700:4700::1111", "::1"))
    delivery.post_webhook("http://hooks.example.com/x", "s3cret", "hello")
    [request] = network.requests
    assert request.url.host == "2606:4700:4700::1111" and request.headers["host"] == "hooks.example.com"
    assert "sni_hostname" not in request.extensions


def test_it_still_delivers_to_a_real_receiver_through_the_pinned_address(team: Team, webhook: Any) -> None:
    delivery.post_webhook(webhook.url, "s3cret", "hello")
    [(headers, body)] = webhook.posts
    assert json.loads(body) == {"text": "hello"}
    assert headers["host"] == webhook.url.split("/")[2]


HOSTILE = "<!channel> urgent: <https://evil.example/login|Open the run> & @here [the run](https://evil.example) `x`"


def later(seconds: float) -> Any:
    return time_machine.travel(timezone.now() + timedelta(seconds=seconds), tick=True)


def test_it_makes_model_written_words_inert_in_a_slack_digest(team: Team, webhook: Any) -> None:
    operator = team.users["operator"]
    subscriptions.create(operator, {"workspace": team.slug, "kinds": ["question"], "webhook_url": webhook.url})
    question_run(team.workspace, operator, question=HOSTILE)
    with later(10):
        digests.sweep(send=lambda pk: digests.deliver(pk))
    [text] = webhook.texts()
    assert "<!channel>" not in text and "<https://evil" not in text
    assert "&lt;!channel&gt; urgent: &lt;https://evil.example/login|Open the run&gt; &amp; @here" in text
    # One code span: Markdown receivers (Mattermost, Rocket.Chat) show it literally, no @here, no link.
    [line] = [line for line in text.splitlines() if "question:" in line]
    assert line.strip().startswith("`question: ") and line.strip().endswith("'x'`")
    assert line.strip().count("`") == 2
    # Our own links stay links: only what came from the run is escaped.
    assert f"/w/{team.slug}/inbox/" in text


def test_it_escapes_a_failure_message_and_args_but_leaves_the_email_as_written(team: Team, webhook: Any, smtp_sink: Any) -> None:
    operator = team.users["operator"]
    operator.email = "op@example.test"
    operator.save(update_fields=["email"])
    subscriptions.create(
        operator, {"workspace": team.slug, "kinds": ["approval", "hold"], "webhook_url": webhook.url, "email": True}
    )
    halted_run(team.workspace, operator, detail="<!everyone> <http://x.example|y>")
    approval_run(team.workspace, operator, args={"note": "<@U123> & <#C1>"})
    with later(10):
        digests.sweep(send=lambda pk: digests.deliver(pk))
    [text] = webhook.texts()
    assert "<!everyone>" not in text and "<@U123>" not in text and "<#C1>" not in text and "<http" not in text
    assert "&lt;!everyone&gt;" in text and "&lt;@U123&gt; &amp; &lt;#C1&gt;" in text
    [mail] = smtp_sink.messages
    assert "<!everyone>" in mail.get_content()
