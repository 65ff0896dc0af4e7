"""Helpers for the insights tests: agents with versions, runs driven in-process to their end."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from oz0site import realtime
from runs import kernel
from runs.models import Run
from tests.conftest import Team
from tests.runs.driver import drive


@contextmanager
def nothing_sent() -> Iterator[None]:
    """Runs driven in-process: nothing goes to Celery or the channel layer."""
    publish = realtime.publish
    realtime.publish = lambda groups, payload: None  # type: ignore[assignment]
    previous = kernel.install_sender(lambda ids, chunks, run_id, sessions, priority=5: None)
    try:
        yield
    finally:
        kernel.install_sender(previous)
        realtime.publish = publish  # type: ignore[assignment]


@pytest.fixture(autouse=True)
def no_broker() -> Iterator[None]:
    """These tests drive runs in-process: nothing goes to Celery or the channel layer."""
    with nothing_sent():
        yield


@pytest.fixture(scope="module")
def shared_team(module_transaction: Any) -> Team:
    """One workspace for the tests of a module that read the same history (its fixture, module-wide
    too, builds it in this team's workspace once: see `team` below)."""
    with module_transaction.unblock():
        return Team()


def team_of(history: str) -> Any:
    """A module's `team`: the shared one for a test that reads the module's `history` fixture, a new
    one otherwise (a test that counts an empty workspace's agents gets one)."""

    @pytest.fixture
    def team(request: pytest.FixtureRequest, db: Any) -> Team:
        if history in request.fixturenames:
            return request.getfixturevalue("shared_team")  # type: ignore[no-any-return]
        return Team()

    return team


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
