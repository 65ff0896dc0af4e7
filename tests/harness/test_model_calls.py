"""Model calls in the trace (issue 29): each model request a framework makes is a `provider_call`
event of its round (model, tokens, duration, finish), through the framework's own hooks (Pydantic
AI's capability hooks, the Agents SDK's run hooks, the `usage` of JSON-lines messages); its tokens
are billed whatever the ending, and the run page and the scorecard show tokens and cost per agent
version (prices from genai-prices). Offline, on the frameworks' fake models."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from genai_prices import Usage, calc_price

from runs.models import Run, Task, TraceEvent
from tests.conftest import Team, wait_for
from tests.harness.conftest import RoundThread, harness_manifest, jsonl_manifest, start_run
from tests.runs.driver import drive

SLOW = 30


def _calls(run: Run) -> list[dict[str, Any]]:
    return list(
        TraceEvent.objects.filter(run=run, task_key="r1", event="provider_call").order_by("seq").values_list("data", flat=True)
    )


def _shape(call: dict[str, Any]) -> tuple[Any, ...]:
    assert isinstance(call["duration_ms"], int) and call["duration_ms"] >= 0, call
    return call["attempt"], call["outcome"], call["usage"], call["harness"]


def _after_its_tool_call(run: Run, thread: RoundThread) -> None:
    """The agent's one call of test.echo runs (the test is the worker of the run's other tasks),
    then the round goes on to its end."""
    wait_for(lambda: Task.objects.filter(run=run, key="r1.1").exists(), timeout=SLOW, message="r1.1")
    drive(run)
    thread.join(SLOW)


def _settled(run: Run) -> Run:
    run.refresh_from_db()
    return run


def _usd(model: str, input_tokens: int, output_tokens: int) -> Decimal:
    return Decimal(
        calc_price(Usage(input_tokens=input_tokens, output_tokens=output_tokens), model, provider_id="openai").total_price
    )


@pytest.mark.spec("F7")
def test_each_pydantic_ai_model_request_is_a_provider_event_of_its_round(harness_team: Team) -> None:
    manifest = harness_manifest("pa-calls", {"pydantic_ai": "oz0_test_pydantic_agents:echo"}, tools=["test.echo"])
    run, thread = start_run(harness_team, manifest)
    _after_its_tool_call(run, thread)
    assert _settled(run).status == "completed"
    calls = _calls(run)
    assert [_shape(c) for c in calls] == [
        (1, "answer", {"input_tokens": 10, "output_tokens": 3}, "pydantic_ai"),
        (2, "answer", {"input_tokens": 20, "output_tokens": 4}, "pydantic_ai"),
    ]
    assert {(c["model"], c["provider"], c["route"]) for c in calls} == {
        ("function:_echo_model:", "function", "function:_echo_model:")
    }
    assert Task.objects.get(run=run, key="r1").result["usage"] == {"input_tokens": 30, "output_tokens": 7, "calls": 2}


@pytest.mark.spec("F7", "F6")
@pytest.mark.parametrize("framework", ["pydantic_ai", "openai_agents"])
def test_model_calls_are_traced_and_billed_when_the_round_ends_in_oz_fail(harness_team: Team, framework: str) -> None:
    module = {"pydantic_ai": "oz0_test_pydantic_agents", "openai_agents": "oz0_test_sdk_agents"}[framework]
    manifest = harness_manifest(f"calls-fail-{framework}", {framework: f"{module}:spends_then_fails"}, tools=["test.echo"])
    run, thread = start_run(harness_team, manifest)
    _after_its_tool_call(run, thread)
    run = _settled(run)
    assert run.failure["kind"] == "not_found"
    assert [_shape(c) for c in _calls(run)] == [
        (1, "answer", {"input_tokens": 30, "output_tokens": 6}, framework),
        (2, "answer", {"input_tokens": 40, "output_tokens": 9}, framework),
    ]
    round_task = Task.objects.get(run=run, key="r1")
    assert round_task.error_key == "oz_fail"
    assert round_task.result["usage"] == {"input_tokens": 70, "output_tokens": 15, "calls": 2}


@pytest.mark.spec("F7")
@pytest.mark.parametrize("framework", ["pydantic_ai", "openai_agents"])
def test_model_calls_are_traced_and_billed_when_the_model_crashes_the_round(harness_team: Team, framework: str) -> None:
    module = {"pydantic_ai": "oz0_test_pydantic_agents", "openai_agents": "oz0_test_sdk_agents"}[framework]
    manifest = harness_manifest(f"calls-crash-{framework}", {framework: f"{module}:spends_then_crashes"}, tools=["test.echo"])
    run, thread = start_run(harness_team, manifest)
    _after_its_tool_call(run, thread)
    round_task = Task.objects.get(run=_settled(run), key="r1")
    assert round_task.error_key == "harness_crashed"
    calls = _calls(run)
    assert [_shape(c) for c in calls] == [
        (1, "answer", {"input_tokens": 25, "output_tokens": 5}, framework),
        (2, "error", {"input_tokens": 0, "output_tokens": 0}, framework),
    ]
    assert calls[1]["exception"] == "RuntimeError" and "exploded" not in json.dumps(calls)
    assert round_task.result["usage"] == {"input_tokens": 25, "output_tokens": 5, "calls": 2}


def _usage_line(model: str, input_tokens: int, output_tokens: int, **more: Any) -> dict[str, Any]:
    message = {"type": "usage", "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}, "model": model, **more}
    return {"raw": json.dumps(message)}


@pytest.mark.spec("F7")
def test_a_json_lines_usage_line_is_a_provider_event_billed_although_the_harness_crashes(harness_team: Team) -> None:
    script = [
        _usage_line("gpt-4o", 100, 20, provider="openai", duration_ms=850, finish="stop"),
        {"crash": 3},
    ]
    run, thread = start_run(harness_team, jsonl_manifest("jl-calls-crash", script))
    thread.join(SLOW)
    round_task = Task.objects.get(run=_settled(run), key="r1")
    assert round_task.error_key == "harness_crashed"
    assert _calls(run) == [
        {
            "route": "openai:gpt-4o",
            "model": "gpt-4o",
            "provider": "openai",
            "attempt": 1,
            "outcome": "answer",
            "usage": {"input_tokens": 100, "output_tokens": 20},
            "finish": "stop",
            "duration_ms": 850,
            "harness": "jsonl",
        }
    ]
    assert round_task.result["usage"] == {"input_tokens": 100, "output_tokens": 20, "calls": 1}
    _, document = harness_team.api("viewer").get(f"/runs/{run.pk}")
    assert document["cost"] == {
        "input_tokens": 100,
        "output_tokens": 20,
        "calls": 1,
        "cost_usd": str(_usd("gpt-4o", 100, 20).quantize(Decimal("0.000001"))),
        "unpriced_models": [],
    }
    # A viewer (no content) sees the call's model, tokens and duration: structure, not words.
    _, trace = harness_team.api("viewer").get(f"/runs/{run.pk}/trace")
    seen = [e["data"] for e in trace["events"] if e["event"] == "provider_call"]
    assert seen and seen[0]["model"] == "gpt-4o" and seen[0]["duration_ms"] == 850


@pytest.mark.spec("F7", "F18")
def test_the_scorecard_and_the_run_page_show_tokens_and_cost_per_agent_version(harness_team: Team) -> None:
    first_script = [_usage_line("gpt-4o", 100, 20, provider="openai"), {"done": "one"}]
    second_script = [
        _usage_line("gpt-4o", 1000, 200, provider="openai"),
        _usage_line("a-private-model", 7, 3),
        {"done": "two"},
    ]
    first, thread = start_run(harness_team, jsonl_manifest("jl-cost", first_script))
    thread.join(SLOW)
    second, thread = start_run(harness_team, jsonl_manifest("jl-cost", second_script))  # another manifest: v2
    thread.join(SLOW)
    assert (_settled(first).agent_version.version, _settled(second).agent_version.version) == (1, 2)

    status, card = harness_team.api("viewer").get(f"/insights/agents/jl-cost?workspace={harness_team.slug}")
    assert status == 200, card
    six = Decimal("0.000001")
    first_cost, second_cost = _usd("gpt-4o", 100, 20), _usd("gpt-4o", 1000, 200)
    assert {v["version"]: v["usage"] for v in card["versions"]} == {
        2: {
            "input_tokens": 1007,
            "output_tokens": 203,
            "calls": 2,
            "cost_usd": str(second_cost.quantize(six)),
            "unpriced_models": ["a-private-model"],
        },
        1: {
            "input_tokens": 100,
            "output_tokens": 20,
            "calls": 1,
            "cost_usd": str(first_cost.quantize(six)),
            "unpriced_models": [],
        },
    }
    assert card["usage"]["cost_usd"] == str((first_cost + second_cost).quantize(six))
    assert card["usage"]["input_tokens"] == 1107

    client = Client()
    client.force_login(harness_team.users["viewer"])
    scorecard = client.get(f"/w/{harness_team.slug}/agents/jl-cost/").content.decode()
    assert f"${second_cost.quantize(six)}" in scorecard and f"${first_cost.quantize(six)}" in scorecard
    page = client.get(f"/runs/{second.pk}/").content.decode()
    assert "1007 in / 203 out tokens" in page and f"${second_cost.quantize(six)}" in page and "a-private-model" in page


def test_a_windowed_scorecard_leaves_the_all_time_usage_out(harness_team: Team) -> None:
    run, thread = start_run(harness_team, jsonl_manifest("jl-window", [_usage_line("gpt-4o", 5, 5), {"done": "x"}]))
    thread.join(SLOW)
    status, card = harness_team.api("viewer").get(f"/insights/agents/jl-window?workspace={harness_team.slug}&since=2020-01-01")
    assert status == 200 and card["usage"] is None and card["versions"][0]["usage"] is None
    assert card["versions"][0]["code"] is None
