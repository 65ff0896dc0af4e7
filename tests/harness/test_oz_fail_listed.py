"""oz.fail in the harnesses (F6, F7): offered to the framework or protocol only when the agent's
`tools:` list it, and honoured only then; from any other agent a call of it is refused
(round_expansion_refused) and never ends the job with the kind it named."""

from __future__ import annotations

import json

import pytest

from runs.models import Run, Task
from runs.worker.harness.acp_mcp_server import tools_of
from tests.conftest import Team
from tests.harness.conftest import harness_manifest, jsonl_manifest, record_path, records, start_run

SLOW = 90


def unlisted(manifest: str) -> str:
    """The manifest with oz.fail taken out of its `tools:` (its `failures:` kept)."""
    document = json.loads(manifest)
    document["tools"] = [name for name in document["tools"] if name != "oz.fail"]
    return json.dumps(document)


def _settled(run: Run) -> Run:
    run.refresh_from_db()
    return run


def _not_ended_by_the_agents_kind(run: Run) -> None:
    run = _settled(run)
    assert (run.failure or {}).get("kind") != "not_found", run.failure
    assert not Task.objects.filter(run=run, error_key="oz_fail").exists()


@pytest.mark.spec("F6", "F7")
def test_a_jsonl_agent_that_does_not_list_oz_fail_is_not_offered_it_and_its_call_is_refused(harness_team: Team) -> None:
    record = record_path()
    script = [{"fail": {"kind": "not_found", "message": "gone"}}, {"done": "$last"}]
    run, thread = start_run(harness_team, unlisted(jsonl_manifest("jl-unlisted", script, record=record)))
    thread.join(SLOW)
    run = _settled(run)
    start, refusal = records(record)[:2]
    assert "oz.fail" not in start["builtins"] and "oz.ask" in start["builtins"]
    assert refusal["ok"] is False and refusal["failure"]["error"] == "round_expansion_refused"
    assert "oz.fail" in refusal["failure"]["message"]
    # The agent read the refusal and went on: the job answered, it did not end with `not_found`.
    assert run.status == "completed" and run.output["failure"]["error"] == "round_expansion_refused"
    _not_ended_by_the_agents_kind(run)


@pytest.mark.spec("F6", "F7")
def test_a_jsonl_agent_that_lists_oz_fail_is_offered_it(harness_team: Team) -> None:
    record = record_path()
    script = [{"fail": {"kind": "not_found", "message": "gone"}}]
    run, thread = start_run(harness_team, jsonl_manifest("jl-listed", script, record=record))
    thread.join(SLOW)
    assert "oz.fail" in records(record)[0]["builtins"]
    assert _settled(run).failure["kind"] == "not_found"


@pytest.mark.spec("F6", "F7")
def test_a_pydantic_ai_agent_that_does_not_list_oz_fail_has_no_oz_fail_tool(harness_team: Team) -> None:
    listing = unlisted(harness_manifest("pa-unlisted-tools", {"pydantic_ai": "oz0_test_pydantic_agents:lists_tools"}))
    run, thread = start_run(harness_team, listing)
    thread.join(SLOW)
    assert json.loads(_settled(run).output) == ["oz__ask"]
    listed, thread = start_run(
        harness_team, harness_manifest("pa-listed-tools", {"pydantic_ai": "oz0_test_pydantic_agents:lists_tools"})
    )
    thread.join(SLOW)
    assert json.loads(_settled(listed).output) == ["oz__ask", "oz__fail"]
    # An agent whose model calls oz__fail anyway cannot end the job with its kind.
    failing, thread = start_run(
        harness_team, unlisted(harness_manifest("pa-unlisted", {"pydantic_ai": "oz0_test_pydantic_agents:declared"}))
    )
    thread.join(SLOW)
    _not_ended_by_the_agents_kind(failing)


@pytest.mark.spec("F6", "F7")
def test_the_acp_mcp_server_offers_fail_only_to_an_agent_that_lists_oz_fail(harness_team: Team) -> None:
    assert set(tools_of({"builtins": ["oz.fail", "oz.ask"], "tools": []})) == {"fail", "ask"}
    assert set(tools_of({"builtins": ["oz.ask"], "tools": []})) == {"ask"}
    record = record_path()
    script = [{"tool": "fail", "args": {"kind": "not_found", "message": "gone"}}, {"say": "$last"}]
    env = {"OZ0_TEST_SCRIPT": json.dumps(script), "OZ0_TEST_RECORD": str(record)}
    manifest = unlisted(harness_manifest("acp-unlisted", {"acp": {"program": "acp-scripted", "env": env}}))
    run, thread = start_run(harness_team, manifest)
    thread.join(SLOW)
    assert [r["names"] for r in records(record) if r.get("event") == "tools"] == [["ask"]]
    _not_ended_by_the_agents_kind(run)


@pytest.mark.spec("F6", "F7")
def test_an_openai_agents_sdk_agent_that_does_not_list_oz_fail_has_no_oz_fail_tool(harness_team: Team) -> None:
    manifest = unlisted(harness_manifest("oa-unlisted", {"openai_agents": "oz0_test_sdk_agents:declared"}))
    run, thread = start_run(harness_team, manifest)
    thread.join(SLOW)
    # The scripted model calls oz__fail, which the SDK agent was never given: the job cannot end with it.
    _not_ended_by_the_agents_kind(run)
    assert Task.objects.get(run=run, key="r1").status == "failed"
