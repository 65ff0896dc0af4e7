"""The acceptance run: the shipped assistant agent against the fake OpenAI-compatible server goes
round → 3 tool calls → round → answer, with every request, token count and tool result in the trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.agents import fakes as f
from tests.conftest import ROOT, Team, wait_for

pytestmark = pytest.mark.live


@pytest.mark.spec("F2", "S5", "S7")
def test_it_runs_the_demo_agent_through_three_tool_calls(provider_team: Team, fakes: dict[str, f.FakeServer]) -> None:
    manifest = Path(ROOT / "oz0agents" / "examples" / "assistant.yaml").read_text()
    status, body = provider_team.api().post("/agents", {"manifest": manifest})
    assert status == 201 and body["name"] == "assistant", body
    version = body["version"]
    # The manifest's route is openai:gpt-4o-mini; the test's `openai` entry points at the fake server.
    fakes["openai"].script(
        "gpt-4o-mini",
        [
            f.openai_calls([("clock__now", {}), ("clock__now", {}), ("clock__now", {})], prompt=50, completion=20),
            f.openai_text("It is now, three times over.", prompt=120, completion=9),
        ],
    )
    status, body = provider_team.api().post(
        f"/workspaces/{provider_team.slug}/runs", {"agent": "assistant", "input": {"question": "what time is it?"}}
    )
    assert status == 201, body
    run_id = body["run"]["id"]

    def settled() -> dict[str, Any] | None:
        _, document = provider_team.api().get(f"/runs/{run_id}")
        return document if document["status"] in ("completed", "canceled", "needs_attention") else None

    document = wait_for(settled, timeout=40, message="the demo run")
    assert document["status"] == "completed", document
    assert document["output"] == "It is now, three times over."
    assert document["agent"] == "assistant" and document["agent_version"] == version
    tasks = {t["key"]: t for t in document["tasks"]}
    assert sorted(tasks) == ["r1", "r1.1", "r1.2", "r1.3"]
    assert all(tasks[k]["status"] == "completed" and tasks[k]["kind"] == "tool" for k in ("r1.1", "r1.2", "r1.3"))
    assert tasks["r1"]["result"]["usage"] == {"input_tokens": 170, "output_tokens": 29, "calls": 2}

    _, trace = provider_team.api().get(f"/runs/{run_id}/trace")
    calls = [e["data"] for e in trace["events"] if e["event"] == "provider_call"]
    assert len(calls) == 2
    assert [c["usage"] for c in calls] == [{"input_tokens": 50, "output_tokens": 20}, {"input_tokens": 120, "output_tokens": 9}]
    first, second = (c["request"] for c in calls)
    assert "what time is it?" in first["messages"][0]["content"]
    assert first["system"].startswith("Answer the person's question")
    assert calls[0]["answer"]["tool_calls"] == [{"tool": "clock.now", "args": {}}] * 3
    results = [m for m in second["messages"] if m["role"] == "tool"]
    assert [m["id"] for m in results] == ["r1.1", "r1.2", "r1.3"] and all(m["ok"] for m in results)
    assert all("unix" in json.loads(m["content"]) for m in results)
    # What the provider really received carries the same three results.
    sent = fakes["openai"].requests_for("gpt-4o-mini")[1]["body"]["messages"]
    assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] == ["oz_r1_1", "oz_r1_2", "oz_r1_3"]
    # The rules let clock.* through: each call crossed the approval stage without resting.
    assert not [e for e in trace["events"] if e["to"] == "needs_approval"]
