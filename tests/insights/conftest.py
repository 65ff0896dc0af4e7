"""Helpers for the insights tests: agents with versions, runs driven in-process to their end."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from oz0site import realtime
from runs import kernel
from runs.models import Run
from tests.runs.driver import drive


@pytest.fixture(autouse=True)
def no_broker(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """These tests drive runs in-process: nothing goes to Celery or the channel layer."""
    monkeypatch.setattr(realtime, "publish", lambda groups, payload: None)
    previous = kernel.install_sender(lambda ids, chunks, run_id, sessions, priority=5: None)
    yield
    kernel.install_sender(previous)


def oz_fail_round(kind: str = "not_found", message: str = "the words") -> dict[str, Any]:
    return {
        "key": "r1",
        "kind": "round",
        "model": "script",
        "prompt": "go",
        "tools": ["oz.fail"],
        "script": [{"oz_fail": {"kind": kind, "message": message}}],
    }


def answering_round() -> dict[str, Any]:
    return {"key": "r1", "kind": "round", "model": "script", "prompt": "go", "script": [{"text": "ok"}]}


def run_agent(team: Any, agent: str, task: dict[str, Any], *, workspace: str | None = None) -> Run:
    """Create a run of `agent` with one task as the operator and drive it to rest."""
    status, doc = team.api("operator").post(
        f"/workspaces/{workspace or team.slug}/runs", {"agent": agent, "tasks": [task], "deliverable": task["key"]}
    )
    assert status == 201, doc
    return drive(Run.objects.get(pk=doc["run"]["id"]))
