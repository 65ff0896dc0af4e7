"""`./oz0 runner`: an executor process that serves tools on this machine (S8, S10).

It registers with an operator's token, then claims advertised calls, runs each here while
heartbeating its lease, and reports the result over the executor API. It talks to oz0 only
over HTTP, so it runs on any machine that can reach the server.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
from collections.abc import Callable
from typing import Any

import httpx
from django.core.management.base import BaseCommand, CommandError, CommandParser


class CallCanceled(Exception):
    pass


class LocalCall:
    def __init__(self, args: dict[str, Any], cancel: threading.Event, executor: str) -> None:
        self.args = args
        self.cancel = cancel
        self.executor = executor

    def sleep(self, seconds: float) -> None:
        if self.cancel.wait(max(0.0, seconds)):
            raise CallCanceled()


def _remote(call: LocalCall) -> Any:
    """test.remote: proves where it ran; `seconds` keeps it busy (to test leases)."""
    call.sleep(float(call.args.get("seconds") or 0))
    if call.args.get("fail"):
        raise RuntimeError(str(call.args["fail"]))
    return {"id": call.args.get("id"), "executor": call.executor, "host": socket.gethostname(), "pid": os.getpid()}


def _echo(call: LocalCall) -> Any:
    """shell.echo: the machine's own printf, with the text as one argument (no shell)."""
    text = call.args.get("text", "")
    if not isinstance(text, str):
        raise ValueError("`text` must be a string")
    done = subprocess.run(["printf", "%s", text], capture_output=True, text=True, timeout=10, check=True)
    return done.stdout


LOCAL_TOOLS: dict[str, Callable[[LocalCall], Any]] = {"test.remote": _remote, "shell.echo": _echo}


class Command(BaseCommand):
    help = "Serve tools on this machine as an oz0 executor (runner)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--url", default=os.environ.get("OZ0_URL", "http://127.0.0.1:8000"), help="the oz0 server")
        parser.add_argument(
            "--token", default=os.environ.get("OZ0_TOKEN", ""), help="an operator's API token (registers the executor)"
        )
        parser.add_argument(
            "--tools",
            default="shell.echo",
            help=f"comma-separated tools to serve, of {', '.join(LOCAL_TOOLS)} (test.remote needs a server with OZ0_TEST_TOOLS=1)",
        )
        parser.add_argument("--name", default=socket.gethostname()[:100])
        parser.add_argument("--workspace", default=None, help="serve only this workspace's calls")
        parser.add_argument("--poll", type=float, default=1.0, help="seconds between claims when there is nothing to do")
        parser.add_argument("--max-calls", type=int, default=0, help="exit after this many calls (0: serve until stopped)")
        parser.add_argument("--revoke-on-exit", action="store_true", help="revoke the executor when the runner stops")

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["token"]:
            raise CommandError("an operator's token is needed: --token or OZ0_TOKEN")
        tools = [t.strip() for t in options["tools"].split(",") if t.strip()]
        unknown = [t for t in tools if t not in LOCAL_TOOLS]
        if unknown:
            raise CommandError(f"this runner cannot serve {', '.join(unknown)} (it serves {', '.join(LOCAL_TOOLS)})")
        self.base = options["url"].rstrip("/") + "/api/v1"
        self.name = options["name"]
        self.stopping = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        signal.signal(signal.SIGINT, lambda *_: self.stopping.set())
        with httpx.Client(timeout=30) as client:
            self.client = client
            body: dict[str, Any] = {"tools": tools, "name": self.name}
            if options["workspace"]:
                body["workspace"] = options["workspace"]
            response = client.post(f"{self.base}/executors", json=body, headers={"Authorization": f"Bearer {options['token']}"})
            if response.status_code != 201:
                raise CommandError(f"registering failed: HTTP {response.status_code} {response.text[:500]}")
            registered = response.json()
            self.executor_id = registered["id"]
            self.headers = {"Authorization": f"Bearer {registered['token']}"}
            self.lease = float(registered.get("lease_seconds") or 30)
            self.say(f"registered executor {self.executor_id} serving {', '.join(tools)}")
            served = 0
            try:
                while not self.stopping.is_set():
                    if options["max_calls"] and served >= options["max_calls"]:
                        break
                    call = self.claim()
                    if call is None:
                        self.stopping.wait(options["poll"])
                        continue
                    self.serve(call)
                    served += 1
            finally:
                if options["revoke_on_exit"]:
                    client.delete(f"{self.base}/executors/{self.executor_id}", headers=self.headers)
                    self.say(f"revoked executor {self.executor_id}")
        self.say(f"stopped after {served} call(s)")

    def say(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()

    def claim(self) -> dict[str, Any] | None:
        try:
            response = self.client.post(f"{self.base}/executors/{self.executor_id}/claim", headers=self.headers)
        except httpx.HTTPError as error:
            self.say(f"claim failed: {error}")
            return None
        if response.status_code == 204:
            return None
        if response.status_code != 200:
            if response.status_code == 401:
                self.say("the executor's token is no longer accepted (revoked?); stopping")
                self.stopping.set()
            else:
                self.say(f"claim failed: HTTP {response.status_code} {response.text[:300]}")
            return None
        return dict(response.json())

    def serve(self, call: dict[str, Any]) -> None:
        call_id = call["call"]
        self.say(f"claimed call {call_id} ({call['tool']}, run {call['run']}, task {call['task']})")
        cancel = threading.Event()
        done = threading.Event()
        beat = threading.Thread(target=self._heartbeat, args=(call_id, cancel, done), daemon=True)
        beat.start()
        body: dict[str, Any]
        try:
            value = LOCAL_TOOLS[call["tool"]](LocalCall(dict(call.get("args") or {}), cancel, self.name))
            body = {"ok": True, "value": value}
        except CallCanceled:
            body = {"ok": False, "stopped": True}
        except Exception as error:  # the tool's failure is the call's answer, not the runner's end
            body = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        finally:
            done.set()
            beat.join(timeout=5)
        response = self.client.post(
            f"{self.base}/executors/{self.executor_id}/calls/{call_id}/result", json=body, headers=self.headers
        )
        outcome = "ok" if body["ok"] else ("stopped" if body.get("stopped") else "failed")
        self.say(f"reported call {call_id} {outcome}: HTTP {response.status_code}")

    def _heartbeat(self, call_id: str, cancel: threading.Event, done: threading.Event) -> None:
        interval = max(0.2, self.lease / 3)
        while not done.wait(interval):
            try:
                response = self.client.post(
                    f"{self.base}/executors/{self.executor_id}/calls/{call_id}/heartbeat", headers=self.headers
                )
            except httpx.HTTPError:
                continue
            if response.status_code == 409 or (response.status_code == 200 and response.json().get("cancel")):
                cancel.set()
                return
