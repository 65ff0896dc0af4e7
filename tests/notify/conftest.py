"""A local SMTP sink (aiosmtpd) and a local webhook receiver (http.server in a thread)."""

from __future__ import annotations

import email
import email.policy
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from aiosmtpd.controller import Controller


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SmtpSink:
    def __init__(self) -> None:
        self.messages: list[email.message.EmailMessage] = []
        self.recipients: list[list[str]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 - aiosmtpd's hook name
        self.messages.append(email.message_from_bytes(envelope.content, policy=email.policy.default))  # type: ignore[arg-type]
        self.recipients.append(list(envelope.rcpt_tos))
        return "250 OK"


@pytest.fixture
def smtp_sink(settings: Any) -> Iterator[SmtpSink]:
    sink = SmtpSink()
    port = _free_port()
    controller = Controller(sink, hostname="127.0.0.1", port=port)
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST = "127.0.0.1"
    settings.EMAIL_PORT = port
    settings.EMAIL_USE_TLS = False
    settings.EMAIL_TIMEOUT = 5
    try:
        yield sink
    finally:
        controller.stop()


class WebhookReceiver:
    def __init__(self) -> None:
        self.posts: list[tuple[dict[str, str], bytes]] = []
        self.paths: list[str] = []
        # Status codes to answer, in order; 200 once they run out.
        self.answers: list[int] = []
        self.url = ""

    def texts(self) -> list[str]:
        return [json.loads(body)["text"] for _, body in self.posts]

    def text_at(self, suffix: str) -> str:
        [text] = [text for path, text in zip(self.paths, self.texts(), strict=True) if path.endswith(suffix)]
        return text


@pytest.fixture
def webhook(settings: Any) -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's hook name
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            receiver.paths.append(self.path)
            receiver.posts.append(({k.lower(): v for k, v in self.headers.items()}, body))
            status = receiver.answers.pop(0) if receiver.answers else 200
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/T0/B0/abc"
    # The receiver listens on loopback: allowed here, refused by default (tested separately).
    settings.OZ0_NOTIFY_PRIVATE_WEBHOOKS = True
    settings.OZ0_PUBLIC_URL = "http://oz0.test"
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
