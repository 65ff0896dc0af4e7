"""Drives a conformance scenario (a list of steps) through the JSON API against the live stack.

The step language follows the scenario format: create, wait, expect, verb, verb_run, append,
answer_blocked, resolve_token, register_agent, inbox_contains, trace_has_no, as,
count_runs, expect_nowhere.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from runs.models import Run
from tests.conftest import Team


def substitute(value: Any, uniq: str) -> Any:
    if isinstance(value, str):
        return value.replace("$uniq", uniq)
    if isinstance(value, list):
        return [substitute(v, uniq) for v in value]
    if isinstance(value, dict):
        if set(value) == {"$big"}:
            return "x" * int(value["$big"])
        return {k: substitute(v, uniq) for k, v in value.items()}
    return value


def lookup(document: dict[str, Any], path: str) -> Any:
    """`run.status`, `run.attention.reason`, `task.<key>.error.key` (task keys may hold dots)."""
    if path.startswith("run."):
        node: Any = document
        parts = path[len("run.") :].split(".")
    elif path.startswith("task."):
        rest = path[len("task.") :]
        tasks = {t["key"]: t for t in document.get("tasks", [])}
        key = max((k for k in tasks if rest == k or rest.startswith(k + ".")), key=len, default=None)
        if key is None:
            return None
        node = tasks[key]
        remainder = rest[len(key) :].lstrip(".")
        parts = remainder.split(".") if remainder else []
    else:
        raise AssertionError(f"unknown path {path!r}")
    for part in parts:
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def matches(actual: Any, expected: Any) -> bool:
    if isinstance(expected, dict) and set(expected) == {"contains"}:
        needle = expected["contains"]
        if isinstance(actual, list):
            return needle in actual
        return isinstance(actual, str) and str(needle) in actual
    if isinstance(expected, dict) and set(expected) == {"len"}:
        return actual is not None and len(actual) == expected["len"]
    return actual == expected


class ScenarioRun:
    def __init__(self, team: Team, steps: list[dict[str, Any]]) -> None:
        self.team = team
        self.steps = steps
        self.uniq = uuid.uuid4().hex[:10]
        self.role = "operator"
        self.run_id: str | None = None
        self.receipt: dict[str, Any] = {}
        self.runs_before: int | None = None

    @property
    def api(self) -> Any:
        return self.team.api(self.role)

    def document(self) -> dict[str, Any]:
        assert self.run_id, "no run was created yet"
        status, body = self.api.get(f"/runs/{self.run_id}")
        assert status == 200, (status, body)
        return body

    def play(self) -> None:
        for index, raw in enumerate(self.steps):
            step = substitute(raw, self.uniq)
            try:
                self.step(step)
            except AssertionError as error:
                raise AssertionError(f"step {index + 1} {json.dumps(raw)[:300]}: {error}") from None

    def step(self, step: dict[str, Any]) -> None:
        expect_http = step.get("expect_http")
        if "as" in step:
            self.role = step["as"]
        elif "create" in step or "create_raw" in step:
            if "create_raw" in step:
                status, body = self.api.post(f"/workspaces/{self.team.slug}/runs", raw=step["create_raw"])
            else:
                status, body = self.api.post(f"/workspaces/{self.team.slug}/runs", step["create"])
            self._check_http(status, body, expect_http or 201, step.get("expect_error_key"))
            if status == 201:
                self.run_id = body["run"]["id"]
                self.receipt = body["receipt"]
        elif "wait" in step:
            self._wait(step["wait"], float(step.get("timeout", 30)))
        elif "expect" in step:
            document = self.document()
            for path, expected in step["expect"].items():
                actual = lookup(document, path)
                assert matches(actual, expected), f"{path} is {actual!r}, expected {expected!r}"
        elif "verb" in step:
            status, body = self.api.post(f"/runs/{self.run_id}/tasks/{step['task']}/{step['verb']}", step.get("body", {}))
            self._check_http(status, body, expect_http or 200, step.get("expect_error_key"))
        elif "verb_run" in step:
            status, body = self.api.post(f"/runs/{self.run_id}/{step['verb_run']}", step.get("body", {}))
            self._check_http(status, body, expect_http or 200, step.get("expect_error_key"))
        elif "append" in step:
            status, body = self.api.post(f"/runs/{self.run_id}/append", step["append"])
            self._check_http(status, body, expect_http or 200, step.get("expect_error_key"))
        elif "answer_blocked" in step:
            keys = (self.document().get("attention") or {}).get("blocked_task_keys") or []
            assert keys, "the run names no blocked task"
            status, body = self.api.post(f"/runs/{self.run_id}/tasks/{keys[0]}/answer", step["answer_blocked"])
            self._check_http(status, body, 200, None)
        elif "resolve_token" in step:
            token = self.receipt["tokens"][step["resolve_token"]["task"]]
            status, body = self.api.post(f"/awaits/{token}", {"value": step["resolve_token"].get("value")})
            self._check_http(status, body, 200, None)
        elif "register_agent" in step:
            status, body = self.team.api("operator").post("/agents", {"manifest": step["register_agent"]})
            assert status in (200, 201), (status, body)
        elif "inbox_contains" in step:
            wanted = step["inbox_contains"]
            status, body = self.api.get(f"/inbox?workspace={self.team.slug}")
            assert status == 200, (status, body)
            found = [
                item
                for item in body["items"]
                if item.get("kind") == wanted.get("kind")
                and item.get("task") == wanted.get("task")
                and item.get("run") == self.run_id
            ]
            assert found, f"the inbox does not list {wanted}: {body['items']}"
        elif "trace_has_no" in step:
            status, body = self.api.get(f"/runs/{self.run_id}/trace")
            assert status == 200
            for field, value in step["trace_has_no"].items():
                hits = [e for e in body["events"] if e.get(field) == value]
                assert not hits, f"trace has {field}={value!r}: {hits}"
        elif "count_runs" in step:
            count = Run.objects.filter(workspace=self.team.workspace).count()
            if self.runs_before is None:
                self.runs_before = count
            else:
                assert count == self.runs_before, f"{count} runs now, {self.runs_before} before"
        elif "expect_nowhere" in step:
            self._expect_nowhere(step["expect_nowhere"])
        else:
            raise AssertionError(f"unknown step {step}")

    def _check_http(self, status: int, body: Any, expected: Any, error_key: str | None) -> None:
        allowed = expected if isinstance(expected, list) else [expected]
        assert status in allowed, f"HTTP {status} (expected {allowed}): {str(body)[:500]}"
        if status >= 400:
            assert isinstance(body, dict) and "error" in body and body["error"].get("key"), f"untyped error: {body}"
        if error_key is not None:
            assert body["error"]["key"] == error_key, f"error key {body['error']['key']!r}, expected {error_key!r}"

    def _wait(self, conditions: dict[str, Any], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        document: dict[str, Any] = {}
        while time.monotonic() < deadline:
            document = self.document()
            if all(matches(lookup(document, p), v) for p, v in conditions.items()):
                return
            time.sleep(0.1)
        seen = {p: lookup(document, p) for p in conditions}
        summary = {t["key"]: (t["status"], (t.get("error") or {}).get("key")) for t in document.get("tasks", [])}
        raise AssertionError(f"timed out after {timeout}s waiting for {conditions}; saw {seen}; tasks {summary}")

    def _expect_nowhere(self, text: str) -> None:
        surfaces = {
            "run document": self.api.get(f"/runs/{self.run_id}"),
            "trace": self.api.get(f"/runs/{self.run_id}/trace"),
            "wait": self.api.get(f"/runs/{self.run_id}/wait?after=0&timeout=0"),
            "inbox": self.api.get(f"/inbox?workspace={self.team.slug}"),
            "audit": self.api.get(f"/workspaces/{self.team.slug}/audit"),
        }
        for name, (status, body) in surfaces.items():
            assert status == 200, f"{name}: HTTP {status} {body}"
            assert text not in json.dumps(body), f"{text!r} leaks through the {name} to a {self.role}"
        from django.test import Client

        client = Client()
        client.force_login(self.team.users[self.role])
        for url in (
            f"/runs/{self.run_id}/",
            f"/w/{self.team.slug}/inbox/",
            f"/w/{self.team.slug}/audit/",
            f"/w/{self.team.slug}/audit/?format=csv",
        ):
            response = client.get(url)
            if response.status_code == 404 and url.startswith("/w/"):
                continue
            shown = b"".join(response.streaming_content) if response.streaming else response.content
            assert text not in shown.decode(errors="replace"), f"{text!r} leaks through {url} to a {self.role}"
