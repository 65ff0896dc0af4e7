"""Rounds through the real HTTP providers on the live stack, against the fake servers (S23-S27, S30)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.agents import fakes as f
from tests.conftest import Team, wait_for

pytestmark = pytest.mark.live

SETTLED = ("completed", "canceled", "needs_attention")


def _model() -> str:
    return f"m-{uuid.uuid4().hex[:10]}"


def _run(
    team: Team, route: str, *, fallback: list[str] | None = None, tools: list[str] | None = None, deliverable: str = "r1"
) -> str:
    task: dict[str, Any] = {"key": "r1", "kind": "round", "model": route, "prompt": "do the thing", "on_failure": "halt"}
    if fallback:
        task["fallback_models"] = fallback
    if tools is not None:
        task["tools"] = tools
    status, body = team.api().post(
        f"/workspaces/{team.slug}/runs", {"tasks": [task], "deliverable": deliverable, "approval": {"mode": "bypass"}}
    )
    assert status == 201, body
    return str(body["run"]["id"])


def _settled(team: Team, run_id: str, timeout: float = 40) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        status, body = team.api().get(f"/runs/{run_id}")
        assert status == 200
        return body if body["status"] in SETTLED else None

    return wait_for(done, timeout=timeout, message=f"run {run_id} to settle")


def _task(document: dict[str, Any], key: str) -> dict[str, Any]:
    return next(t for t in document["tasks"] if t["key"] == key)


def _trace(team: Team, run_id: str) -> list[dict[str, Any]]:
    status, body = team.api().get(f"/runs/{run_id}/trace")
    assert status == 200
    return list(body["events"])


def _calls(team: Team, run_id: str) -> list[dict[str, Any]]:
    return [e["data"] for e in _trace(team, run_id) if e["event"] == "provider_call"]


@pytest.mark.spec("S22")
def test_it_fails_a_401_as_provider_model_unavailable(provider_team: Team, fakes: dict[str, f.FakeServer]) -> None:
    document = _settled(provider_team, _run(provider_team, f"badkey:{_model()}"))
    r1 = _task(document, "r1")
    assert r1["status"] == "failed" and r1["error"]["key"] == "provider_model_unavailable"
    assert document["attention"]["reason"] == "halt_failure"


@pytest.mark.spec("S26")
def test_it_waits_out_a_429_and_succeeds(provider_team: Team, fakes: dict[str, f.FakeServer]) -> None:
    model = _model()
    fakes["openai"].script(
        model, [f.openai_error(429, code="rate_limit_exceeded", retry_after="0.6", kind="requests"), f.openai_text("fine")]
    )
    run_id = _run(provider_team, f"fakeai:{model}")
    document = _settled(provider_team, run_id)
    assert document["status"] == "completed" and document["output"] == "fine"
    sent = fakes["openai"].requests_for(model)
    assert len(sent) == 2 and sent[1]["at"] - sent[0]["at"] >= 0.55
    calls = _calls(provider_team, run_id)
    assert [c.get("status") for c in calls] == [429, None]
    assert _task(document, "r1")["result"]["usage"]["input_tokens"] == 11


@pytest.mark.spec("S26", "S27")
def test_it_switches_an_overloaded_route_to_its_fallback(provider_team: Team, fakes: dict[str, f.FakeServer]) -> None:
    first, second = _model(), _model()
    fakes["anthropic"].script(
        first,
        [
            f.anthropic_error(529, "overloaded_error"),
            f.anthropic_stream_error("overloaded_error"),
            f.anthropic_error(529, "overloaded_error"),
        ],
    )
    fakes["openai"].script(second, [f.openai_text("from the fallback")])
    run_id = _run(provider_team, f"fakeant:{first}", fallback=[f"fakeai:{second}"])
    document = _settled(provider_team, run_id)
    r1 = _task(document, "r1")
    assert document["status"] == "completed" and document["output"] == "from the fallback"
    assert r1["result"]["model_change"] == {"from": f"fakeant:{first}", "to": f"fakeai:{second}", "reason": "provider_overloaded"}
    assert len(fakes["anthropic"].requests_for(first)) == 3


@pytest.mark.spec("S26")
def test_it_exhausts_mixed_transient_failures(provider_team: Team, fakes: dict[str, f.FakeServer]) -> None:
    model, spare = _model(), _model()
    fakes["openai"].script(model, [f.openai_error(503), f.openai_error(500), f.openai_error(503)])
    document = _settled(provider_team, _run(provider_team, f"fakeai:{model}", fallback=[f"fakeai:{spare}"]))
    r1 = _task(document, "r1")
    assert r1["error"]["key"] == "provider_transient_exhausted"
    assert fakes["openai"].requests_for(spare) == []


@pytest.mark.spec("S25")
def test_it_switches_a_classifier_refusal_with_its_category(provider_team: Team, fakes: dict[str, f.FakeServer]) -> None:
    first, second = _model(), _model()
    fakes["anthropic"].script(first, [f.anthropic_message([], "refusal", stop_details={"type": "refusal", "category": "bio"})])
    fakes["openai"].script(second, [f.openai_text("answered elsewhere")])
    document = _settled(provider_team, _run(provider_team, f"fakeant:{first}", fallback=[f"fakeai:{second}"]))
    r1 = _task(document, "r1")
    assert document["output"] == "answered elsewhere"
    assert r1["result"]["model_change"] == {
        "from": f"fakeant:{first}",
        "to": f"fakeai:{second}",
        "reason": "model_refused",
        "category": "bio",
    }
    # The refused attempt's tokens stay billed beside the fallback's.
    assert r1["result"]["usage"]["input_tokens"] == 13 + 11


@pytest.mark.spec("S25")
def test_it_never_switches_a_blocked_answer(provider_team: Team, fakes: dict[str, f.FakeServer]) -> None:
    model, spare = _model(), _model()
    fakes["openai"].script(model, [f.openai_completion({"refusal": "no"}, "stop")])
    run_id = _run(provider_team, f"fakeai:{model}", fallback=[f"fakeai:{spare}"])
    document = _settled(provider_team, run_id)
    r1 = _task(document, "r1")
    assert r1["error"]["key"] == "model_refused" and "model_change" not in (r1["result"] or {})
    assert r1["result"]["usage"]["input_tokens"] == 11
    assert fakes["openai"].requests_for(spare) == []
    status, body = provider_team.api().post(f"/runs/{run_id}/tasks/r1/retry")
    assert status == 200, body
    document = _settled(provider_team, run_id)
    # The retry may not renew the refused route; the unspent fallback is the only way on.
    assert len(fakes["openai"].requests_for(model)) == 1


@pytest.mark.spec("S24")
def test_it_fails_an_abnormal_finish_with_the_providers_word(provider_team: Team, fakes: dict[str, f.FakeServer]) -> None:
    model = _model()
    fakes["openai"].script(
        model,
        [
            f.openai_completion(
                {
                    "content": "half",
                    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "test__echo", "arguments": "{}"}}],
                },
                "insufficient_system_resource",
            )
        ],
    )
    run_id = _run(provider_team, f"fakeai:{model}", tools=["test.echo"])
    document = _settled(provider_team, run_id)
    r1 = _task(document, "r1")
    assert r1["error"]["key"] == "provider_error" and "insufficient_system_resource" in r1["error"]["detail"]
    assert [t["key"] for t in document["tasks"]] == ["r1"]  # nothing expanded
    assert len(fakes["openai"].requests_for(model)) == 1  # nothing retried
    assert r1["result"]["usage"]["output_tokens"] == 7


@pytest.mark.spec("S23")
def test_it_fails_a_length_refusal_with_no_history(provider_team: Team, fakes: dict[str, f.FakeServer]) -> None:
    model = _model()
    fakes["openai"].script(
        model,
        [f.openai_error(400, code="context_length_exceeded", message="maximum context length", kind="invalid_request_error")],
    )
    document = _settled(provider_team, _run(provider_team, f"fakeai:{model}"))
    assert _task(document, "r1")["error"]["key"] == "provider_context_overflow"


@pytest.mark.spec("S23")
def test_it_compacts_a_length_refusal_with_history(provider_team: Team, fakes: dict[str, f.FakeServer]) -> None:
    model = _model()
    fakes["openai"].script(
        model,
        [
            f.openai_calls([("test__echo", {"value": "v"})]),
            f.openai_error(400, code="context_length_exceeded", message="maximum context length", kind="invalid_request_error"),
            f.openai_text("a short summary"),
            f.openai_text("done after compaction"),
        ],
    )
    run_id = _run(provider_team, f"fakeai:{model}", tools=["test.echo"])
    document = _settled(provider_team, run_id)
    assert document["status"] == "completed" and document["output"] == "done after compaction"
    kinds = {t["key"]: t["kind"] for t in document["tasks"]}
    assert kinds["r1.2"] == "summarizer"
    sent = fakes["openai"].requests_for(model)
    summarizing = sent[2]["body"]["messages"]
    assert [m["role"] for m in summarizing] == ["system", "user"]
    assert 'assistant called test.echo {"value": "v"}' in summarizing[1]["content"]
    final = sent[-1]["body"]["messages"]
    assert any("a short summary" in str(m.get("content")) for m in final)


@pytest.mark.spec("S30")
def test_it_refuses_33_calls_in_one_answer(provider_team: Team, fakes: dict[str, f.FakeServer]) -> None:
    model = _model()
    fakes["openai"].script(model, [f.openai_calls([("test__echo", {"value": i}) for i in range(33)])])
    document = _settled(provider_team, _run(provider_team, f"fakeai:{model}", tools=["test.echo"]))
    assert _task(document, "r1")["error"]["key"] == "too_wide_a_fan"
    assert len(document["tasks"]) == 1


def test_it_refuses_a_call_to_an_unknown_tool(provider_team: Team, fakes: dict[str, f.FakeServer]) -> None:
    model = _model()
    fakes["openai"].script(model, [f.openai_calls([("rm__rf", {})])])
    document = _settled(provider_team, _run(provider_team, f"fakeai:{model}", tools=["test.echo"]))
    r1 = _task(document, "r1")
    assert r1["error"]["key"] == "round_expansion_refused" and "rm.rf" in r1["error"]["detail"]


def test_it_refuses_malformed_arguments_without_crashing(provider_team: Team, fakes: dict[str, f.FakeServer]) -> None:
    model = _model()
    fakes["openai"].script(model, [f.openai_calls([("test__echo", '{"value": ')]), f.openai_text("the worker is still alive")])
    document = _settled(provider_team, _run(provider_team, f"fakeai:{model}", tools=["test.echo"]))
    r1 = _task(document, "r1")
    assert r1["error"]["key"] == "round_expansion_refused" and "not JSON" in r1["error"]["detail"]
    # The same worker goes on serving rounds.
    other = _model()
    fakes["openai"].script(other, [f.openai_text("still here")])
    assert _settled(provider_team, _run(provider_team, f"fakeai:{other}"))["output"] == "still here"


@pytest.mark.spec("S9", "S20")
def test_it_turns_the_ask_tool_into_a_question(provider_team: Team, fakes: dict[str, f.FakeServer]) -> None:
    model = _model()
    fakes["anthropic"].script(
        model, [f.anthropic_tool_use([("oz__ask", {"question": "which repo?"})]), f.anthropic_text("thanks")]
    )
    run_id = _run(provider_team, f"fakeant:{model}")

    def asked() -> dict[str, Any] | None:
        _, body = provider_team.api().get(f"/runs/{run_id}")
        return body if "awaiting_human" in body["announcements"] else None

    document = wait_for(asked, timeout=30, message="the question")
    assert _task(document, "r1.1")["status"] == "awaiting_input"
    status, body = provider_team.api().post(f"/runs/{run_id}/tasks/r1.1/answer", {"value": "oz0"})
    assert status == 200, body
    assert _settled(provider_team, run_id)["output"] == "thanks"
    last = fakes["anthropic"].requests_for(model)[-1]["body"]["messages"]
    assert last[-1]["content"][0] == {"type": "tool_result", "tool_use_id": "oz_r1_1", "content": "oz0"}
