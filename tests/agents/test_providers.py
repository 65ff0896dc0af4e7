"""The HTTP providers against local fake servers speaking each API's wire format (S24-S26)."""

from __future__ import annotations

import uuid

import pytest

from runs.worker.providers.anthropic import AnthropicProvider
from runs.worker.providers.base import AttemptFailed, ProviderRequest
from runs.worker.providers.openai import OpenAIProvider
from tests.agents import fakes as f
from tests.agents.conftest import providers_config


def _model() -> str:
    return f"m-{uuid.uuid4().hex[:8]}"


def _request(model: str, **kwargs: object) -> ProviderRequest:
    messages = kwargs.pop("messages", [{"role": "user", "content": "hello"}])
    tools = kwargs.pop("tools", [{"name": "test.echo", "description": "echo", "parameters": {"type": "object"}}])
    return ProviderRequest(route=f"x:{model}", model=model, system="be brief", messages=messages, tools=tools)  # type: ignore[arg-type]


@pytest.fixture
def openai(fakes: dict[str, f.FakeServer]) -> OpenAIProvider:
    return OpenAIProvider("fakeai", providers_config(fakes)["fakeai"])


@pytest.fixture
def anthropic(fakes: dict[str, f.FakeServer]) -> AnthropicProvider:
    return AnthropicProvider("fakeant", providers_config(fakes)["fakeant"])


def _fail(call: object) -> AttemptFailed:
    with pytest.raises(AttemptFailed) as info:
        call()  # type: ignore[operator]
    return info.value


# ---- OpenAI Chat Completions ----


def test_it_sends_the_chat_completions_wire_format(openai: OpenAIProvider, fakes: dict[str, f.FakeServer]) -> None:
    model = _model()
    fakes["openai"].script(model, [f.openai_text("hi there", prompt=21, completion=3)])
    history = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "tool_calls": [{"id": "r1.1", "tool": "test.echo", "args": {"value": 1}}]},
        {"role": "tool", "id": "r1.1", "tool": "test.echo", "ok": True, "content": "1"},
    ]
    answer = openai.complete(_request(model, messages=history))
    assert answer.text == "hi there"
    assert answer.usage == {"input_tokens": 21, "output_tokens": 3}
    sent = fakes["openai"].requests_for(model)[0]
    assert sent["headers"]["authorization"] == "Bearer sk-fake-openai"
    body = sent["body"]
    assert body["messages"][0] == {"role": "system", "content": "be brief"}
    assert body["messages"][2]["tool_calls"][0]["function"] == {"name": "test__echo", "arguments": '{"value": 1}'}
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "oz_r1_1", "content": "1"}
    names = [t["function"]["name"] for t in body["tools"]]
    assert names == ["test__echo", "oz__ask"]


@pytest.mark.spec("S9")
def test_it_decodes_tool_calls_and_the_ask_tool(openai: OpenAIProvider, fakes: dict[str, f.FakeServer]) -> None:
    model = _model()
    fakes["openai"].script(
        model,
        [
            f.openai_calls([("test__echo", {"value": "a"}), ("oz__fail", {"kind": "nope", "message": "m"})]),
            f.openai_calls([("oz__ask", {"question": "which one?"})]),
        ],
    )
    answer = openai.complete(_request(model))
    assert answer.tool_calls == [
        {"tool": "test.echo", "args": {"value": "a"}},
        {"tool": "oz.fail", "args": {"kind": "nope", "message": "m"}},
    ]
    assert openai.complete(_request(model)).ask == "which one?"


def test_it_maps_statuses_and_retry_after(openai: OpenAIProvider, fakes: dict[str, f.FakeServer]) -> None:
    model = _model()
    fakes["openai"].script(
        model,
        [
            f.openai_error(429, code="rate_limit_exceeded", retry_after="2", kind="requests"),
            f.openai_error(503),
            f.openai_error(
                400,
                code="context_length_exceeded",
                message="This model's maximum context length is 128000 tokens",
                kind="invalid_request_error",
            ),
        ],
    )
    limited = _fail(lambda: openai.complete(_request(model)))
    assert (limited.kind, limited.http_status, limited.retry_after) == ("http", 429, 2.0)
    assert _fail(lambda: openai.complete(_request(model))).http_status == 503
    assert _fail(lambda: openai.complete(_request(model))).kind == "context_overflow"


def test_it_reports_a_wrong_key_as_401(fakes: dict[str, f.FakeServer]) -> None:
    provider = OpenAIProvider("badkey", providers_config(fakes)["badkey"])
    failure = _fail(lambda: provider.complete(_request(_model())))
    assert (failure.kind, failure.http_status) == ("http", 401)


@pytest.mark.spec("S24", "S25")
def test_it_maps_refusals_finishes_and_length(openai: OpenAIProvider, fakes: dict[str, f.FakeServer]) -> None:
    model = _model()
    fakes["openai"].script(
        model,
        [
            f.openai_completion({"refusal": "I can't help with that."}, "stop"),
            f.openai_completion({"content": "partial"}, "content_filter"),
            f.openai_completion({"content": "half an ans"}, "insufficient_system_resource"),
            f.openai_completion({"content": None}, "length"),
            f.openai_calls([("test__echo", '{"value": ')]),
        ],
    )
    refused = _fail(lambda: openai.complete(_request(model)))
    assert (refused.kind, refused.refusal, refused.usage["input_tokens"]) == ("refusal", "blocked", 11)
    assert _fail(lambda: openai.complete(_request(model))).refusal == "blocked"
    finish = _fail(lambda: openai.complete(_request(model)))
    assert (finish.kind, finish.word) == ("finish_error", "insufficient_system_resource")
    assert _fail(lambda: openai.complete(_request(model))).kind == "context_overflow"
    assert _fail(lambda: openai.complete(_request(model))).kind == "malformed"


def test_it_reports_an_unreachable_server_as_transport() -> None:
    provider = OpenAIProvider("gone", {"base_url": "http://127.0.0.1:9/v1", "api_key": "k", "timeout": 2})
    assert _fail(lambda: provider.complete(_request(_model()))).kind == "transport"


# ---- Anthropic Messages (streamed) ----


def test_it_streams_the_messages_wire_format(anthropic: AnthropicProvider, fakes: dict[str, f.FakeServer]) -> None:
    model = _model()
    fakes["anthropic"].script(
        model,
        [
            f.anthropic_tool_use(
                [("test__echo", {"value": [1, 2]}), ("oz__fail", {"kind": "k", "message": "m"})],
                input_tokens=40,
                output_tokens=12,
            )
        ],
    )
    history = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "tool_calls": [{"id": "r1.1", "tool": "test.echo", "args": {}}, {"id": "r1.2", "tool": "test.fail", "args": {}}],
        },
        {"role": "tool", "id": "r1.1", "tool": "test.echo", "ok": True, "content": "1"},
        {"role": "tool", "id": "r1.2", "tool": "test.fail", "ok": False, "content": '{"failed": true}'},
        {"role": "assistant", "ask": "which?", "key": "r1.3"},
        {"role": "user", "content": "the second", "answers": "r1.3"},
    ]
    answer = anthropic.complete(_request(model, messages=history))
    assert answer.tool_calls == [
        {"tool": "test.echo", "args": {"value": [1, 2]}},
        {"tool": "oz.fail", "args": {"kind": "k", "message": "m"}},
    ]
    assert answer.usage == {"input_tokens": 40, "output_tokens": 12}
    sent = fakes["anthropic"].requests_for(model)[0]
    assert sent["headers"]["x-api-key"] == "sk-ant-fake" and sent["headers"]["anthropic-version"] == "2023-06-01"
    body = sent["body"]
    assert body["stream"] is True and body["system"] == "be brief" and body["max_tokens"] == 512
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["user", "assistant", "user", "assistant", "user"]
    results = body["messages"][2]["content"]
    assert results[1] == {"type": "tool_result", "tool_use_id": "oz_r1_2", "content": '{"failed": true}', "is_error": True}
    assert body["messages"][3]["content"][0]["name"] == "oz__ask"
    assert body["messages"][4]["content"][0]["tool_use_id"] == "oz_r1_3"


@pytest.mark.spec("S26")
def test_it_maps_a_streamed_overloaded_error(anthropic: AnthropicProvider, fakes: dict[str, f.FakeServer]) -> None:
    model = _model()
    fakes["anthropic"].script(
        model, [f.anthropic_stream_error("overloaded_error"), f.anthropic_error(529, "overloaded_error", retry_after="1")]
    )
    streamed = _fail(lambda: anthropic.complete(_request(model)))
    assert (streamed.kind, streamed.word) == ("stream_error", "overloaded_error")
    status = _fail(lambda: anthropic.complete(_request(model)))
    assert (status.kind, status.http_status, status.retry_after) == ("http", 529, 1.0)


@pytest.mark.spec("S23", "S24", "S25")
def test_it_maps_anthropic_stops(anthropic: AnthropicProvider, fakes: dict[str, f.FakeServer]) -> None:
    model = _model()
    fakes["anthropic"].script(
        model,
        [
            f.anthropic_message([], "refusal", stop_details={"type": "refusal", "category": "cyber", "explanation": "no"}),
            f.anthropic_message([{"type": "text", "text": "so far"}], "pause_turn"),
            f.anthropic_message([], "max_tokens"),
            f.anthropic_error(400, "invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum"),
            f.anthropic_tool_use([("oz__ask", {"question": "really?"})]),
            f.anthropic_text("all done"),
        ],
    )
    refusal = _fail(lambda: anthropic.complete(_request(model)))
    assert (refusal.kind, refusal.refusal, refusal.category, refusal.usage["input_tokens"]) == (
        "refusal",
        "classifier",
        "cyber",
        13,
    )
    finish = _fail(lambda: anthropic.complete(_request(model)))
    assert (finish.kind, finish.word) == ("finish_error", "pause_turn")
    assert _fail(lambda: anthropic.complete(_request(model))).kind == "context_overflow"
    assert _fail(lambda: anthropic.complete(_request(model))).kind == "context_overflow"
    assert anthropic.complete(_request(model)).ask == "really?"
    assert anthropic.complete(_request(model)).text == "all done"


def test_it_reads_an_http_date_retry_after() -> None:
    from datetime import UTC, datetime, timedelta
    from email.utils import format_datetime

    import httpx

    from runs.worker.providers.http import retry_after

    when = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    seconds = retry_after(httpx.Headers({"Retry-After": when}))
    assert seconds is not None and 25 < seconds <= 30
    assert retry_after(httpx.Headers({"retry-after-ms": "250"})) == 0.25
    assert retry_after(httpx.Headers({})) is None
