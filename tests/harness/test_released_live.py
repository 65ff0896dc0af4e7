"""Waits hold nothing, on the real stack (issue 29): sessions released while they wait on an
approval (their processes kept, no thread) lose their session worker to a SIGKILL. Their harness
processes die with it; the lease sweep hands each round on as the design says, and the status says
so at each step: a round that has made no non-replayable call is queued again and its new session
waits on the same call, never a second one; a round waiting on the approval of a non-replayable
call (a tool with an effect, an ACP agent's own tool) becomes `uncertain` for a person, its call
still in the person's hands. The approvals then reach the work once: the effect runs once, the
retried sessions answer from the journal, and every run completes."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from runs.kernel import call_digest
from runs.models import Task, TraceEvent
from tests.conftest import LiveStack, Team, wait_for
from tests.harness.conftest import harness_manifest, jsonl_manifest, record_path
from testtools.models import EffectRecord

pytestmark = [pytest.mark.live, pytest.mark.slow]
SLOW = 120
PERMISSION = {"kind": "execute", "title": "Ship 1.2", "raw_input": {"command": "ship 1.2"}}


def _harness_processes(marker: Path) -> list[int]:
    """The processes whose environment names `marker` (a harness's record file): its sandbox and program."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if str(marker).encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _document(team: Team, run_id: str) -> dict[str, Any]:
    status, document = team.api().get(f"/runs/{run_id}")
    assert status == 200, document
    return dict(document)


def _r1(document: dict[str, Any]) -> dict[str, Any]:
    return next(task for task in document["tasks"] if task["key"] == "r1")


def _approve(team: Team, run_id: str) -> None:
    call = Task.objects.get(run_id=run_id, key="r1.1")
    digest = call_digest(call.spec["tool"], call.spec["args"])
    status, body = team.api("operator").post(f"/runs/{run_id}/tasks/r1.1/approve", {"digest": digest})
    assert status == 200, body


def _create(team: Team, name: str, manifest: str) -> str:
    status, body = team.api().post("/agents", {"manifest": manifest})
    assert status == 201, body
    status, body = team.api().post(f"/workspaces/{team.slug}/runs", {"agent": name})
    assert status == 201, body
    return str(body["run"]["id"])


@pytest.mark.spec("F7", "S5", "S10", "S14")
def test_sessions_released_on_approvals_survive_a_killed_session_worker_truthfully(
    short_park_sessions: LiveStack, live_team: Team
) -> None:
    effect = uuid.uuid4().hex
    records = {name: record_path() for name in ("echo", "effect", "acp")}
    echo_script = [{"call": "test.echo", "args": {"value": "shipped"}}, {"done": "$last"}]
    effect_script = [{"call": "test.effect", "args": {"id": effect}}, {"done": "$last"}]
    acp_env = {
        "OZ0_TEST_SCRIPT": json.dumps([{"permission": PERMISSION}, {"say": "$last"}]),
        "OZ0_TEST_RECORD": str(records["acp"]),
    }
    runs = {
        # A replayable call waits on its approval: the round may start again blind.
        "echo": _create(
            live_team,
            "kill-echo",
            jsonl_manifest("kill-echo", echo_script, record=records["echo"], tools=["test.echo"], approval="ask"),
        ),
        # A call with an effect waits on its approval: the round is a person's to retry.
        "effect": _create(
            live_team,
            "kill-effect",
            jsonl_manifest("kill-effect", effect_script, record=records["effect"], tools=["test.effect"], approval="ask"),
        ),
        # An ACP agent's permission request (its own tool: non-replayable) waits.
        "acp": _create(
            live_team,
            "kill-acp",
            harness_manifest("kill-acp", {"acp": {"program": "acp-scripted", "env": acp_env}}, approval="ask"),
        ),
    }

    def all_released() -> bool:
        return all(_r1(_document(live_team, run_id)).get("session") == "released" for run_id in runs.values())

    wait_for(all_released, timeout=SLOW, message="the three sessions released")
    for name, run_id in runs.items():
        assert Task.objects.get(run_id=run_id, key="r1.1").status == "needs_approval", name
        assert _harness_processes(records[name]), f"{name}'s harness process is kept while released"

    short_park_sessions.kill_sessions()
    # Their processes die with the session worker (the sandbox's parent-death signal).
    for name in runs:
        wait_for(lambda name=name: not _harness_processes(records[name]), timeout=30, message=f"{name}'s process ended")

    # The lease sweep hands each round on, and the documents say so.
    def swept(run_id: str) -> dict[str, Any] | None:
        document = _document(live_team, run_id)
        return document if _r1(document)["status"] != "running" else None

    echo = wait_for(lambda: swept(runs["echo"]), timeout=SLOW, message="the echo round handed on")
    assert echo["status"] == "running" and _r1(echo)["status"] == "waiting" and _r1(echo)["session"] == "queued"
    for name in ("effect", "acp"):
        document = wait_for(lambda name=name: swept(runs[name]), timeout=SLOW, message=f"the {name} round handed on")
        r1 = Task.objects.get(run_id=runs[name], key="r1")
        # The run still has live work (the approval), so it stays `running`; its round says it is uncertain.
        assert (document["status"], r1.status, r1.error_key) == ("running", "uncertain", "round_uncertain"), name
        assert _r1(document)["status"] == "uncertain"
        assert "r1.1" in r1.error_detail and "needs_approval" in r1.error_detail  # not run yet, and said so
        assert _r1(document)["session"] is None
    for run_id in runs.values():
        assert Task.objects.get(run_id=run_id, key="r1.1").status == "needs_approval"  # still the person's

    # The person approves with no session worker alive; the effect runs once, on the task worker.
    for run_id in runs.values():
        _approve(live_team, run_id)
    wait_for(lambda: EffectRecord.objects.filter(effect_id=effect).count() == 1, timeout=SLOW, message="the effect")
    for name in ("effect", "acp"):
        # Nothing live is left in them but the uncertain round: the run needs a person.
        wait_for(
            lambda name=name: _document(live_team, runs[name])["status"] == "needs_attention",
            timeout=SLOW,
            message=f"the {name} run needing attention",
        )
    short_park_sessions.start_sessions()
    # The uncertain rounds are the person's: a retry that confirms the call it made.
    for name in ("effect", "acp"):
        status, body = live_team.api("operator").post(f"/runs/{runs[name]}/tasks/r1/retry", {"confirm_calls": ["r1.1"]})
        assert status == 200, body

    def finished(run_id: str) -> dict[str, Any] | None:
        document = _document(live_team, run_id)
        return document if document["status"] in ("completed", "canceled", "failed") else None

    outputs = {
        name: wait_for(lambda r=run_id: finished(r), timeout=SLOW, message=f"{name}'s end") for name, run_id in runs.items()
    }
    for name, document in outputs.items():
        assert document["status"] == "completed", (name, document, short_park_sessions.logs())
        calls = list(Task.objects.filter(run_id=runs[name], key__startswith="r1.").values_list("key", flat=True))
        assert calls == ["r1.1"], (name, calls)  # each session's call answered by the same task
        events = TraceEvent.objects.filter(run_id=runs[name], task_key="r1", event="claim_expired")
        assert events.count() == 1, name
    assert outputs["echo"]["output"]["value"] == "shipped"
    assert json.loads(outputs["acp"]["output"]) == {"outcome": {"outcome": "selected", "optionId": "once"}}
    assert EffectRecord.objects.filter(effect_id=effect).count() == 1  # never a second time
