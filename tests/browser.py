"""The browser tests' fixtures, a plugin of the whole suite (tests/conftest.py's `pytest_plugins`):
the console served for real (daphne: HTTP and websockets) on the live stack's test database, and
headless Debian Chromium driven by Playwright (no browser download). One definition for every
folder's browser tests, so a session starts one console server and one browser, where each
module that imported these fixtures started its own."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, LiveStack

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless=new",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = ROOT / "artifacts" / "screenshots"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ConsoleServer:
    def __init__(self, url: str, process: subprocess.Popen[bytes], log: Path) -> None:
        self.url = url
        self.process = process
        self.log = log

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""


@contextmanager
def daphne(env: dict[str, str], log: Path, port: int, *, start_seconds: float = 30) -> Iterator[ConsoleServer]:
    """oz0 served by daphne on loopback `port` with `env` (its output in `log`), ready once its sign-in
    page answers; stopped with its whole session when the block ends."""
    process = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "oz0site.asgi:application"],
        cwd=ROOT,
        env=env,
        stdout=open(log, "ab"),  # noqa: SIM115 - kept open for the process's life
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + start_seconds
    while True:
        try:
            with urllib.request.urlopen(f"{url}/login/", timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            os.killpg(process.pid, signal.SIGKILL)
            raise RuntimeError("daphne did not start:\n" + log.read_text(errors="replace")[-3000:])
        time.sleep(0.2)
    try:
        yield ConsoleServer(url, process, log)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def console_server(live_stack: LiveStack) -> Iterator[ConsoleServer]:
    env = {**live_stack.env, "ALLOWED_HOSTS": "127.0.0.1,localhost", "DEBUG": "1", "PYTHONUNBUFFERED": "1"}
    with daphne(env, live_stack.workdir / "daphne.log", _free_port()) as server:
        yield server


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    """One browser for the session, started by the first test that asks for it. Playwright's sync
    API marks an event loop as running in this thread for as long as it is open, which breaks any
    later test that calls async code from sync (`async_to_sync`): so the tests that use a browser
    run after every other test of their session (tests/conftest.py, browsers_last). Each module
    started its own before: the driver and the browser, about 1.2 s of CPU, 23 times a run."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install -y chromium)")
    # While the loop runs, the tests' own (sync) ORM calls must be allowed in this thread.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                yield browser
            finally:
                browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


class Browser:
    """One person's browser: a context signed in as a user."""

    def __init__(self, chromium: Any, server: ConsoleServer, *, phone: bool = False) -> None:
        viewport = {"width": 390, "height": 844} if phone else {"width": 1280, "height": 860}
        self.context = chromium.new_context(viewport=viewport, device_scale_factor=1)
        self.page = self.context.new_page()
        self.server = server
        self.errors: list[str] = []
        self.page.on("console", lambda message: self.errors.append(message.text) if message.type == "error" else None)
        self.page.on("dialog", lambda dialog: dialog.accept())

    def sign_in(self, username: str) -> None:
        """Signed in as Django's test client signs in (`force_login`): a session the server keeps
        for the person, its cookie in this browser. Through the form a person cost two page loads
        before the test's first (the form, then the inbox it lands on, left when the network went
        quiet); the form is walked in
        test_browser.py's `test_it_lets_an_operator_approve_and_watch_the_run_finish_live`."""
        from django.conf import settings
        from django.contrib.auth.models import User
        from django.test import Client

        client = Client()
        client.force_login(User.objects.get(username=username))
        session = client.cookies[settings.SESSION_COOKIE_NAME].value
        self.context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": session, "url": self.server.url}])

    def sign_in_through_the_form(self, username: str, password: str = "pw-for-tests-only") -> None:
        self.page.goto(f"{self.server.url}/login/")
        self.page.fill("input[name=username]", username)
        self.page.fill("input[name=password]", password)
        self.page.click("button[type=submit]")
        self.page.wait_for_load_state("networkidle")

    def open(self, path: str, *, live: bool = True) -> Any:
        self.page.goto(f"{self.server.url}{path}")
        if live:
            self.page.wait_for_selector("body.live-on", timeout=10_000)
        return self.page

    def shot(self, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def browsers(chromium: Any, console_server: ConsoleServer) -> Iterator[Any]:
    opened: list[Browser] = []

    def open_browser(*, phone: bool = False) -> Browser:
        browser = Browser(chromium, console_server, phone=phone)
        opened.append(browser)
        return browser

    yield open_browser
    for browser in opened:
        browser.close()
