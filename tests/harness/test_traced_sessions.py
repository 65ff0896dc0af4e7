"""A harness session in the run's trace (docs/tracing.md, docs/harness-jsonl.md): its span holds
its round's work, its `start` message hands the span to the harness process (`traceparent`), the
model requests it reports hang under it, and a failure's words are in no span."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from runs.models import Run
from tests.conftest import Team, wait_for
from tests.foundation.otlp import Receiver, by_name, hex_ids, in_memory, in_one_tree, receiving, traced_stack, wait_until_serving
from tests.harness.conftest import jsonl_manifest, record_path, records, start_run
from tests.runs.driver import drive

SLOW = 30


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with in_memory() as exporter:
        yield exporter


def test_a_harness_session_hands_its_span_to_the_process_in_start(harness_team: Team, spans: InMemorySpanExporter) -> None:
    record = record_path()
    script = [{"call": "test.echo", "args": {"value": 41}}, {"done": "$last", "usage": {"input_tokens": 7, "output_tokens": 3}}]
    run, thread = start_run(harness_team, jsonl_manifest("traced-jsonl", script, record=record, tools=["test.echo"]))
    wait_for(lambda: run.tasks.filter(key="r1.1").exists(), timeout=SLOW, message="the harness's call")
    drive(run)
    thread.join(SLOW)
    run.refresh_from_db()
    assert run.status == "completed"
    found = spans.get_finished_spans()
    named = by_name(found)
    in_one_tree(run, found)
    (session,) = named["harness jsonl"]
    assert session.parent is not None and session.parent.span_id == named["task round"][0].context.span_id
    start = records(record)[0]
    assert start["type"] == "start"
    assert start["traceparent"] == f"00-{session.context.trace_id:032x}-{session.context.span_id:016x}-01"
    # What a harness with an OpenTelemetry SDK does with it: its own spans hang under the session's.
    parent = TraceContextTextMapPropagator().extract({"traceparent": start["traceparent"]})
    assert trace.get_current_span(parent).get_span_context().span_id == session.context.span_id
    (reported,) = named["chat unknown"]
    assert reported.parent is not None and reported.parent.span_id == session.context.span_id
    assert reported.attributes is not None and reported.attributes["gen_ai.usage.input_tokens"] == 7
    (tool,) = named["tool test.echo"]
    assert tool.attributes is not None and tool.attributes["oz0.task.key"] == "r1.1"


def test_an_untraced_start_has_no_trace_context(harness_team: Team) -> None:
    record = record_path()
    run, thread = start_run(harness_team, jsonl_manifest("untraced-jsonl", [{"done": 1}], record=record))
    thread.join(SLOW)
    start = records(record)[0]
    assert start["type"] == "start" and "traceparent" not in start and "tracestate" not in start


@pytest.mark.spec("F11")
def test_a_failures_words_never_leave_in_a_span(harness_team: Team, spans: InMemorySpanExporter) -> None:
    """What a failure said is the run's content: the run's span holds its kind, never its message,
    nor does any other span, for whoever reads the trace backend."""
    words = "the issue belongs to Ada Lovelace, 12 Downing St"
    run, thread = start_run(harness_team, jsonl_manifest("traced-fail", [{"fail": {"kind": "not_found", "message": words}}]))
    thread.join(SLOW)
    run.refresh_from_db()
    assert run.status == "canceled" and run.failure is not None and run.failure["message"] == words
    found = spans.get_finished_spans()
    in_one_tree(run, found)
    (run_span,) = by_name(found)["run"]
    assert run_span.attributes is not None and run_span.attributes["oz0.failure.kind"] == "not_found"
    exported = json.dumps([span.to_json() for span in found])
    assert "Lovelace" not in exported and "Downing" not in exported


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving() as serving:
        yield serving


@pytest.mark.live
def test_a_session_on_the_session_worker_is_in_its_runs_trace_over_otlp(
    committed: None, receiver: Receiver, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    with traced_stack(receiver, monkeypatch, settings) as stack:
        stack.start_worker()
        stack.start_sessions()
        wait_until_serving(stack, sessions=True)
        team = Team()
        record = record_path()
        script: list[dict[str, Any]] = [{"call": "test.echo", "args": {"value": 5}}, {"done": "$last"}]
        manifest = jsonl_manifest("traced-live", script, record=record, tools=["test.echo"])
        status, body = team.api().post("/agents", {"manifest": manifest})
        assert status == 201, body
        status, body = team.api().post(f"/workspaces/{team.slug}/runs", {"agent": "traced-live", "input": None})
        assert status == 201, body
        run = Run.objects.get(pk=body["run"]["id"])
        wait_for(lambda: Run.objects.get(pk=run.pk).status == "completed", timeout=60, message=f"the run\n{stack.logs()}")
        trace_id, run_span_id = hex_ids(run)

        def arrived() -> list[dict[str, Any]] | None:
            mine = receiver.of_run(run)
            names = [s["name"] for s in mine]
            # The session's Celery task span ends after the run completes inside it, so it may
            # reach the receiver in a later export than the spans it holds.
            wanted = {"run", "harness jsonl", "tool test.echo", "runs.tasks.execute_session"}
            return mine if wanted <= set(names) else None

        mine = wait_for(arrived, timeout=SLOW, message="the workers' spans")
        (session,) = [s for s in mine if s["name"] == "harness jsonl"]
        assert session["process"] == "worker" and session["attributes"]["oz0.harness.kind"] == "jsonl"
        assert records(record)[0]["traceparent"] == f"00-{trace_id}-{session['id']}-01"
        sessions = [s for s in mine if s["name"] == "runs.tasks.execute_session"]
        assert sessions and all(s["parent"] == run_span_id for s in sessions)
        ids = {s["id"] for s in mine}
        assert all(s["parent"] in ids for s in mine if s["id"] != run_span_id)
