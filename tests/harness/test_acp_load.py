"""ACP `session/load` on a session started again (issue 29, item 1): a retried round's agent, when it
offers `loadSession`, gets the session an earlier session of the round opened back, its conversation
with it; the history it replays is not the round's output. One that cannot load it (gone) gets a new
session. An agent that keeps its sessions under its working folder gets them back too: a round's
job folder is kept across its sessions on a machine (runs/worker/harness/folders.py), and removed
when the run ends. Offline, with the scripted ACP agent keeping its sessions in a folder."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from runs.models import Run, Task, TraceEvent
from tests.conftest import Team
from tests.harness.conftest import RECORDS, RoundThread, harness_manifest, record_path, records, start_run

SLOW = 90


def _crashes_once(team: Team, name: str, *, kept_in: str | None = None) -> tuple[Run, Path, Path]:
    """A run whose agent (keeping its sessions in a folder of the suite's, or `kept_in`, relative to
    its working folder) crashes in its first session, then is retried."""
    sessions = RECORDS / f"acp-sessions-{uuid.uuid4().hex[:8]}"
    sessions.mkdir(mode=0o777)
    sessions.chmod(0o777)
    record = record_path()
    script = [{"once": str(RECORDS / f"{uuid.uuid4().hex}.once"), "crash": 3}, {"say": "done"}]
    env = {
        "OZ0_TEST_SCRIPT": json.dumps(script),
        "OZ0_TEST_RECORD": str(record),
        "OZ0_TEST_ACP_SESSIONS": kept_in or str(sessions),
    }
    run, thread = start_run(team, harness_manifest(name, {"acp": {"program": "acp-scripted", "env": env}}))
    thread.join(SLOW)
    r1 = Task.objects.get(run=run, key="r1")
    assert r1.status == "failed" and r1.error_key == "harness_crashed", (r1.status, r1.error_detail)
    assert r1.state["journal_checkpoint"]["state"]["acp_session"].startswith("s-")
    return run, sessions, record


def _retried(team: Team, run: Run) -> Run:
    status, body = team.api("operator").post(f"/runs/{run.pk}/tasks/r1/retry", {})
    assert status == 200, body
    RoundThread(run).join(SLOW)
    run.refresh_from_db()
    return run


def _sessions(record: Path) -> list[tuple[str, Any]]:
    return [(m["event"], m.get("id")) for m in records(record) if m.get("event") in ("session", "load")]


@pytest.mark.spec("F7", "S10")
def test_a_retried_acp_agent_that_offers_load_session_gets_its_earlier_session_back(harness_team: Team) -> None:
    run, _, record = _crashes_once(harness_team, "acp-load")
    first = _sessions(record)
    assert [event for event, _ in first] == ["session"]
    run = _retried(harness_team, run)
    assert (run.status, run.output) == ("completed", "done"), Task.objects.get(run=run, key="r1").error_detail
    # The second session loaded the first one's (its replayed history is not the output).
    assert _sessions(record) == [first[0], ("load", first[0][1])]
    assert TraceEvent.objects.filter(run=run, task_key="r1", event="journal_resumed").count() == 1


@pytest.mark.spec("F7", "S10")
def test_a_session_the_agent_no_longer_has_is_opened_anew(harness_team: Team) -> None:
    run, sessions, record = _crashes_once(harness_team, "acp-load-gone")
    for stored in sessions.iterdir():
        os.remove(stored)
    run = _retried(harness_team, run)
    assert (run.status, run.output) == ("completed", "done"), Task.objects.get(run=run, key="r1").error_detail
    opened = _sessions(record)
    assert [event for event, _ in opened] == ["session", "session"] and opened[0][1] != opened[1][1]
    assert Task.objects.get(run=run, key="r1").state["journal_checkpoint"]["state"]["acp_session"] == opened[1][1]


@pytest.mark.spec("F7", "S10")
def test_an_agent_keeping_its_sessions_in_its_working_folder_loads_them_after_a_retry(harness_team: Team) -> None:
    run, _, record = _crashes_once(harness_team, "acp-load-cwd", kept_in="acp-sessions")
    [(_, first)] = _sessions(record)
    run = _retried(harness_team, run)
    assert (run.status, run.output) == ("completed", "done"), Task.objects.get(run=run, key="r1").error_detail
    # The retry's session found the first one's in the round's folder, and loaded it.
    assert _sessions(record) == [("session", first), ("load", first)]
    from runs.worker.harness.folders import folder_name
    from runs.worker.harness.sandbox import jobs_folder

    assert not (jobs_folder() / folder_name(run.pk, "r1")).exists()  # the run ended: its round's folder is gone
