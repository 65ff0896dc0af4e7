"""The JSON-lines harness on the real worker (F7): a Celery worker runs the harness process for
the round, a second slot runs the calls it waits on, and the API steers it like any run."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.conftest import ROOT, LiveStack, Team, wait_for
from tests.harness.conftest import RECORDS, jsonl_manifest, record_path, records

pytestmark = pytest.mark.live


def _finished(team: Team, run_id: str) -> dict[str, Any] | None:
    _, document = team.api().get(f"/runs/{run_id}")
    return document if document["status"] in ("completed", "canceled", "needs_attention") else None


def _start(team: Team, agent: str, run_input: Any) -> str:
    status, body = team.api().post(f"/workspaces/{team.slug}/runs", {"agent": agent, "input": run_input})
    assert status == 201, body
    return str(body["run"]["id"])


@pytest.mark.spec("F7", "F6", "S5", "S7")
def test_the_example_jsonl_agent_runs_on_the_worker_and_ends_with_its_declared_kind(live_team: Team) -> None:
    manifest = (ROOT / "oz0agents" / "examples" / "jsonl-triage.yaml").read_text()
    status, body = live_team.api().post("/agents", {"manifest": manifest})
    assert status == 201 and body["name"] == "jsonl-triage", body
    answered = _start(live_team, "jsonl-triage", {"issue": 7})
    failed = _start(live_team, "jsonl-triage", {"issue": 404})
    document = wait_for(lambda: _finished(live_team, answered), timeout=40, message="the answered run")
    assert document["status"] == "completed", document
    assert document["output"].startswith("issue 7 triaged at unix time ")
    tasks = {t["key"]: t for t in document["tasks"]}
    assert tasks["r1.1"]["kind"] == "tool" and tasks["r1.1"]["status"] == "completed" and tasks["r1"]["status"] == "completed"
    document = wait_for(lambda: _finished(live_team, failed), timeout=40, message="the failed run")
    assert document["status"] == "canceled"
    assert {k: document["failure"][k] for k in ("kind", "declared", "person")} == {
        "kind": "not_found",
        "declared": True,
        "person": True,
    }
    _, as_viewer = live_team.api("viewer").get(f"/runs/{failed}")
    assert as_viewer["failure"]["kind"] == "not_found" and as_viewer["failure"]["message"] is None


@pytest.mark.spec("F7", "S5", "S6", "S29")
def test_an_approval_and_a_cancel_reach_a_harness_on_the_worker(live_team: Team) -> None:
    script = [{"call": "test.echo", "args": {"value": 41}}, {"done": "$last"}]
    status, body = live_team.api().post(
        "/agents", {"manifest": jsonl_manifest("jl-live-ask", script, tools=["test.echo"], approval="ask")}
    )
    assert status == 201, body
    run_id = _start(live_team, "jl-live-ask", None)

    def waiting() -> Any:
        _, inbox = live_team.api().get(f"/inbox?workspace={live_team.slug}")
        return [i for i in inbox["items"] if i["run"] == run_id]

    items = wait_for(waiting, timeout=30, message="the call in the inbox")
    assert items[0]["task"] == "r1.1" and items[0]["tool"] == "test.echo"
    status, _ = live_team.api().post(f"/runs/{run_id}/tasks/r1.1/approve", {})
    assert status == 200
    document = wait_for(lambda: _finished(live_team, run_id), timeout=30, message="the approved run")
    assert document["status"] == "completed" and document["output"]["value"] == 41, document

    record = record_path()
    status, body = live_team.api().post(
        "/agents", {"manifest": jsonl_manifest("jl-live-cancel", [{"wait": True}], record=record)}
    )
    assert status == 201, body
    run_id = _start(live_team, "jl-live-cancel", None)
    wait_for(lambda: records(record), timeout=30, message="the harness's start")
    asked = time.time()
    status, _ = live_team.api().post(f"/runs/{run_id}/cancel", {"reason": "enough"})
    assert status == 200
    cancel = wait_for(lambda: [m for m in records(record) if m["type"] == "cancel"], timeout=10, message="the cancel line")
    assert cancel[0]["at"] - asked < 2.0
    document = wait_for(lambda: _finished(live_team, run_id), timeout=30, message="the canceled run")
    assert document["status"] == "canceled" and document["failure"]["kind"] == "cancelled"
    round_task = next(t for t in document["tasks"] if t["key"] == "r1")
    assert round_task["status"] == "canceled" and round_task["error"]["key"] == "run_canceled", json.dumps(round_task)


@pytest.mark.spec("F7", "F6")
def test_the_example_pydantic_ai_agent_runs_on_the_worker(live_team: Team) -> None:
    manifest = (ROOT / "oz0agents" / "examples" / "pydantic-triage.yaml").read_text()
    status, body = live_team.api().post("/agents", {"manifest": manifest})
    assert status == 201, body
    answered = _start(live_team, "pydantic-triage", {"issue": 7})
    failed = _start(live_team, "pydantic-triage", {"issue": 404})
    document = wait_for(lambda: _finished(live_team, answered), timeout=40, message="the answered run")
    assert document["status"] == "completed" and document["output"].startswith("triaged; the clock said"), document
    document = wait_for(lambda: _finished(live_team, failed), timeout=40, message="the failed run")
    assert document["status"] == "canceled" and document["failure"]["kind"] == "not_found"
    assert document["failure"]["declared"] is True


@pytest.mark.spec("F7", "F6")
def test_the_example_openai_agents_sdk_agent_runs_on_the_worker(live_team: Team) -> None:
    manifest = (ROOT / "oz0agents" / "examples" / "openai-triage.yaml").read_text()
    status, body = live_team.api().post("/agents", {"manifest": manifest})
    assert status == 201, body
    answered = _start(live_team, "openai-triage", {"issue": 7})
    failed = _start(live_team, "openai-triage", {"issue": 404})
    document = wait_for(lambda: _finished(live_team, answered), timeout=90, message="the answered run")
    assert document["status"] == "completed" and document["output"] == "triaged; the clock answered", document
    document = wait_for(lambda: _finished(live_team, failed), timeout=90, message="the failed run")
    assert document["status"] == "canceled" and document["failure"]["kind"] == "not_found"
    assert document["failure"]["declared"] is True


@pytest.mark.spec("F7", "F6")
def test_the_example_acp_agent_runs_on_the_worker(live_team: Team) -> None:
    manifest = (ROOT / "oz0agents" / "examples" / "acp-triage.yaml").read_text()
    status, body = live_team.api().post("/agents", {"manifest": manifest})
    assert status == 201, body
    answered = _start(live_team, "acp-triage", {"issue": 7})
    failed = _start(live_team, "acp-triage", {"issue": 404})
    document = wait_for(lambda: _finished(live_team, answered), timeout=90, message="the answered run")
    assert document["status"] == "completed" and document["output"].startswith("issue 7 triaged"), document
    document = wait_for(lambda: _finished(live_team, failed), timeout=90, message="the failed run")
    assert document["status"] == "canceled" and document["failure"]["kind"] == "not_found"


@pytest.mark.spec("F7", "S5")
def test_sessions_waiting_on_people_leave_the_engines_workers_free(live_team: Team) -> None:
    """A harnessed round waits on its calls for as long as they take. More such sessions than the
    worker has slots, every one waiting on a person, must not stop other runs, the sweeps, or the
    calls the sessions themselves wait on (on one pool, two waiting sessions held both slots and
    their own calls never ran)."""
    script = [{"call": "test.echo", "args": {"value": 5}}, {"done": "$last"}]
    status, body = live_team.api().post(
        "/agents", {"manifest": jsonl_manifest("jl-live-many", script, tools=["test.echo"], approval="ask")}
    )
    assert status == 201, body
    waiting_runs = [_start(live_team, "jl-live-many", None) for _ in range(4)]

    def asking() -> Any:
        _, inbox = live_team.api().get(f"/inbox?workspace={live_team.slug}")
        asked = {i["run"] for i in inbox["items"]} & set(waiting_runs)
        return asked if asked == set(waiting_runs) else None

    wait_for(asking, timeout=60, message="every session's call in the inbox")
    status, body = live_team.api().post(
        f"/workspaces/{live_team.slug}/runs",
        {"tasks": [{"key": "plain", "kind": "tool", "tool": "test.echo", "args": {"value": 1}}]},
    )
    assert status == 201, body
    plain = wait_for(lambda: _finished(live_team, str(body["run"]["id"])), timeout=30, message="a plain run beside them")
    assert plain["status"] == "completed", plain
    for run_id in waiting_runs:
        status, _ = live_team.api().post(f"/runs/{run_id}/tasks/r1.1/approve", {})
        assert status == 200
    for run_id in waiting_runs:
        document = wait_for(lambda run_id=run_id: _finished(live_team, run_id), timeout=60, message="an approved session")
        assert document["status"] == "completed" and document["output"]["value"] == 5, document


@pytest.mark.spec("F7")
def test_a_harness_on_the_session_worker_cannot_read_its_environment_or_the_installs_secret(
    live_team: Team, live: LiveStack
) -> None:
    """The attack this closes: an allowed program reads the session worker's /proc/<pid>/environ
    (the database URL, the secret key) and the install's secret key file. The worker runs as root
    here, as under `./oz0 up`: the harness runs as OZ0_HARNESS_USER inside its sandbox."""
    assert live.sessions is not None
    environ = f"/proc/{live.sessions.pid}/environ"
    secret = RECORDS / "live-secret_key"
    secret.write_text("oz0-live-install-secret")
    secret.chmod(0o600)
    manifest = {
        "name": "jl-live-probe",
        "harness": {"jsonl": {"program": "probe", "env": {"OZ0_TEST_PROBE": f"{environ},{secret}"}}},
        "tools": [],
        "approval": {"mode": "bypass"},
    }
    try:
        status, body = live_team.api().post("/agents", {"manifest": json.dumps(manifest)})
        assert status == 201, body
        run_id = _start(live_team, "jl-live-probe", None)
        document = wait_for(lambda: _finished(live_team, run_id), timeout=60, message="the probe")
    finally:
        secret.unlink()
    assert document["status"] == "completed", document
    facts = document["output"]
    assert facts["uid"] != 0 and "oz0-live-install-secret" not in json.dumps(facts)
    assert facts["reads"][environ] == {"error": "ENOENT"} and facts["reads"][str(secret)] == {"error": "EACCES"}
    assert "DATABASE_URL" not in facts["env"] and "SECRET_KEY" not in facts["env"]
