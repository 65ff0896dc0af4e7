"""OpenTelemetry traces (issue 32, item 2; docs/tracing.md): off unless the installer's OTEL_*
variables ask, with nothing of the SDK imported then; on, one trace per run holding the spans of
its tasks, tool calls, model requests and harness sessions, written by the web process, the
workers and handed to the harness processes. Tested with the SDK's in-memory exporter and, on a
real worker, with an OTLP/HTTP receiver the test starts on loopback (protobuf decoded with
opentelemetry-proto)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from oz0site import tracing
from runs import kernel
from runs.models import Run
from tests.conftest import ROOT, Team, wait_for
from tests.delegation.tree import agent, child_of, create, drive_tree
from tests.foundation.otlp import Receiver, by_name, hex_ids, in_memory, in_one_tree, receiving, traced_stack, wait_until_serving
from tests.runs.driver import drive, echo


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with in_memory() as exporter:
        yield exporter


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving() as serving:
        yield serving


def test_it_is_off_unless_the_installers_variables_ask() -> None:
    assert not tracing.configured({})
    assert tracing.configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert tracing.configured({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"})
    assert tracing.configured({"OTEL_TRACES_EXPORTER": "console"})
    assert not tracing.configured({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert not tracing.configured({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"})
    assert not tracing.setup("web", environ={})
    assert not tracing.ACTIVE and tracing.carrier() == {}


def test_it_imports_nothing_of_the_sdk_when_off() -> None:
    """The hot path's hooks are one test of a global: a worker, the web app and a harness session
    load without the SDK's tracing or an exporter, and the web app has no tracing middleware.
    (redis-py imports the SDK's metrics module when it is installed, once, at its own import.)"""
    code = (
        "import sys, django; django.setup()\n"
        "import oz0site.celery, oz0site.asgi, runs.worker.execution, runs.worker.harness.jsonl\n"
        "from django.conf import settings\n"
        "from oz0site import tracing\n"
        "assert tracing.task_span(None) is tracing.tool_span(None) is tracing._OFF\n"
        "assert not any('tracing' in m for m in settings.MIDDLEWARE), settings.MIDDLEWARE\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk.trace', 'opentelemetry.exporter')))\n"
        "assert not loaded, loaded\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_it_names_the_service_oz0_unless_the_installer_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    exporter = InMemorySpanExporter()
    try:
        tracing.setup("worker", exporter=exporter, environ={})
        assert tracing._provider is not None
        attributes = tracing._provider.resource.attributes
        assert attributes["service.name"] == "oz0" and attributes["oz0.process"] == "worker"
        monkeypatch.setenv("OTEL_SERVICE_NAME", "oz0-eu")
        tracing.setup("web", exporter=exporter, environ={"OTEL_SERVICE_NAME": "oz0-eu"})
        assert tracing._provider is not None
        assert tracing._provider.resource.attributes["service.name"] == "oz0-eu"
    finally:
        tracing.teardown()


def test_a_run_of_oz0s_own_loop_is_one_trace_of_its_tasks_tool_calls_and_model_requests(
    committed: None, no_dispatch: list[int], spans: InMemorySpanExporter
) -> None:
    team = Team()
    script = {"script:main": [{"tool_calls": [{"tool": "test.echo", "args": {"value": 1}}]}, {"text": "done"}]}
    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={
            "tasks": [{"key": "r1", "kind": "round", "model": "script:main", "prompt": "go", "script": script}],
            "deliverable": "r1",
            "approval": {"mode": "bypass"},
        },
    )
    run = drive(run)
    assert run.status == "completed"
    found = spans.get_finished_spans()
    named = by_name(found)
    assert set(named) >= {"run", "task round", "task tool", "tool test.echo", "chat main"}, sorted(named)
    in_one_tree(run, found)
    (run_span,) = named["run"]
    assert run_span.attributes is not None and run_span.attributes["oz0.run.status"] == "completed"
    assert run_span.parent is None and run_span.start_time == int(run.created_at.timestamp() * 1e9)
    (tool,) = named["tool test.echo"]
    assert tool.attributes is not None and tool.attributes["oz0.outcome"] == "ok"
    assert tool.parent is not None and tool.parent.span_id == named["task tool"][0].context.span_id
    chats = named["chat main"]
    assert {span.attributes["gen_ai.provider.name"] for span in chats if span.attributes} == {"script"}
    assert all(
        span.parent is not None and span.parent.span_id in {t.context.span_id for t in named["task round"]} for span in chats
    )
    # Ids, names, counts and outcomes only: never the run's words.
    words = json.dumps([dict(span.attributes or {}) for span in found], default=str)
    assert "go" not in json.loads(words) and '"done"' not in words


def test_a_request_is_a_span_named_by_its_pattern_and_a_clients_traceparent_is_not_followed(
    team: Team, settings: Any, spans: InMemorySpanExporter
) -> None:
    """The web process's span: the URL pattern, never the path (a workspace's name); its own
    trace, whatever a client sends (a client does not choose oz0's traces)."""
    from django.test import Client

    settings.MIDDLEWARE = ["oz0site.tracing.TracingMiddleware", *settings.MIDDLEWARE]
    theirs = "0af7651916cd43dd8448eb211c80319c"
    client = Client(HTTP_AUTHORIZATION=f"Bearer {team.tokens['operator']}", HTTP_TRACEPARENT=f"00-{theirs}-b7ad6b7169203331-01")
    assert client.get(f"/api/v1/workspaces/{team.slug}/runs").status_code == 200
    assert client.get("/no-such-page/secret-name").status_code == 404
    listed, missing = spans.get_finished_spans()
    assert listed.name == "GET /api/v1/workspaces/<ws>/runs" and listed.parent is None
    assert listed.attributes is not None and listed.attributes["http.response.status_code"] == 200
    assert missing.name == "GET" and missing.attributes is not None and missing.attributes["http.response.status_code"] == 404
    assert all(f"{span.context.trace_id:032x}" != theirs for span in (listed, missing))
    exported = json.dumps([span.to_json() for span in (listed, missing)])
    assert team.slug not in exported and "secret-name" not in exported


def test_a_child_run_is_a_trace_of_its_own_linked_to_its_parents(
    team: Team, no_dispatch: list[int], django_capture_on_commit_callbacks: Any, spans: InMemorySpanExporter
) -> None:
    helper = agent(team.workspace, "model: script\napproval: {mode: bypass}\nscript:\n  - text: '42'\n", prefix="helper")
    parent = drive_tree(
        create(team.workspace, team.users["operator"], tasks=[{"key": "d", "kind": "delegate", "agent": helper}]),
        django_capture_on_commit_callbacks,
    )
    assert parent.status == "completed"
    child = child_of(parent, "d")
    runs = {span.context.trace_id: span for span in spans.get_finished_spans() if span.name == "run"}
    parent_trace, parent_span = tracing.run_ids(parent.pk)
    child_trace, _ = tracing.run_ids(child.pk)
    assert set(runs) == {parent_trace, child_trace}
    (link,) = runs[child_trace].links
    assert (link.context.trace_id, link.context.span_id) == (parent_trace, parent_span)
    attributes = runs[child_trace].attributes
    assert attributes is not None and attributes["oz0.run.parent"] == str(parent.pk)
    in_one_tree(child, [span for span in spans.get_finished_spans() if span.context.trace_id == child_trace])


@pytest.mark.live
def test_a_run_is_one_trace_across_the_web_process_and_a_worker_exported_over_otlp(
    committed: None, receiver: Receiver, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    with traced_stack(receiver, monkeypatch, settings) as stack:
        stack.start_worker()
        wait_until_serving(stack)
        team = Team()
        body = {"tasks": [echo("a", 1), echo("b", 2, after=["a"])], "deliverable": "b", "approval": {"mode": "bypass"}}
        status, answer = team.api().post(f"/workspaces/{team.slug}/runs", body)
        assert status == 201, answer
        run = Run.objects.get(pk=answer["run"]["id"])
        wait_for(lambda: Run.objects.get(pk=run.pk).status == "completed", timeout=60, message=f"the run\n{stack.logs()}")
        tracing.flush()
        trace_id, run_span_id = hex_ids(run)

        def run_spans() -> list[dict[str, Any]] | None:
            # A message's span ends after the work it carried (after the run's own spans, maybe in
            # a later export batch): wait for the one the request's message made too.
            mine = receiver.of_run(run)
            names = [s["name"] for s in mine]
            posts = {(s["trace"], s["id"]) for s in receiver.found() if s["attributes"].get("http.request.method") == "POST"}
            sent_by_request = any(s["attributes"].get("messaging.system") == "celery" and posts & set(s["links"]) for s in mine)
            done = "run" in names and "tool test.echo" in names and names.count("task tool") == 2
            return mine if done and sent_by_request else None

        mine = wait_for(run_spans, timeout=30, message="the worker's spans")
        requests = [s for s in receiver.found() if s["attributes"].get("http.request.method") == "POST"]
        assert [s["name"] for s in requests] == ["POST /api/v1/workspaces/<ws>/runs"], receiver.found()
        (request,) = requests
        assert request["process"] == "web" and request["service"] == "oz0-test"
        assert request["trace"] != trace_id  # the request has its own trace; the run's work links to it
        processed = [s for s in mine if s["attributes"].get("messaging.system") == "celery"]
        assert processed and all(s["parent"] == run_span_id and s["process"] == "worker" for s in processed)
        assert (request["trace"], request["id"]) in [link for s in processed for link in s["links"]]
        (run_span,) = [s for s in mine if s["name"] == "run"]
        assert run_span["id"] == run_span_id and run_span["parent"] == "" and run_span["process"] == "worker"
        ids = {s["id"] for s in mine}
        assert all(s["parent"] in ids for s in mine if s is not run_span)


# An OTLP/HTTP sink in a process of its own: it answers every export without decoding it, so the
# measured process pays only for its own spans and their export.
SINK = """
from http.server import BaseHTTPRequestHandler, HTTPServer
class Sink(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
        print("batch", flush=True)
    def log_message(self, *args):
        pass
server = HTTPServer(("127.0.0.1", 0), Sink)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


@pytest.mark.slow
def test_the_overhead_on_and_off_side_by_side(committed: None, no_dispatch: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """The same runs of three tool calls driven in-process, traces off and on (OTLP/HTTP to a sink
    on loopback, through the batch processor, as installed), alternating: the best wall and CPU
    times of each are printed with their ratio, and bounded loosely (the machine is shared). Then
    the hooks of one tool call alone, off and on."""
    team = Team()
    body = {
        "tasks": [echo("a"), echo("b", after=["a"]), echo("c", after=["b"])],
        "deliverable": "c",
        "approval": {"mode": "bypass"},
    }

    def drive_runs(count: int) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(count):
            run, _ = kernel.create_run(workspace=team.workspace, user=team.users["operator"], body=body)
            assert drive(run).status == "completed"
        return time.perf_counter() - wall, time.process_time() - cpu

    sink = subprocess.Popen([sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True)
    try:
        assert sink.stdout is not None
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{sink.stdout.readline().strip()}")
        drive_runs(3)  # warm
        rounds, times = 10, {"off": [], "on": []}  # type: ignore[var-annotated]
        for _ in range(3):
            times["off"].append(drive_runs(rounds))
            assert tracing.setup("worker")
            try:
                times["on"].append(drive_runs(rounds))
                tracing.flush()
            finally:
                tracing.teardown()
    finally:
        sink.terminate()
        exported = sink.communicate(timeout=10)[0].count("batch")
    assert exported > 0
    wall = {way: min(t[0] for t in found) for way, found in times.items()}
    cpu = {way: min(t[1] for t in found) for way, found in times.items()}
    hooks_off = _hook_seconds(20_000)
    # The spans' own cost, without their export (the batch processor's thread's).
    assert tracing.setup("worker", exporter=InMemorySpanExporter(), environ={})
    try:
        hooks_on = _hook_seconds(2_000)
    finally:
        tracing.teardown()
    print(
        f"\n{rounds} runs of 3 tool calls, best of 3: wall off {wall['off'] * 1000:.0f} ms, on {wall['on'] * 1000:.0f} ms "
        f"(ratio {wall['on'] / wall['off']:.2f}); CPU off {cpu['off'] * 1000:.0f} ms, on {cpu['on'] * 1000:.0f} ms "
        f"(ratio {cpu['on'] / cpu['off']:.2f}); a tool call's task and tool spans (CPU): "
        f"off {hooks_off * 1e6:.2f} us, on {hooks_on * 1e6:.0f} us; load {os.getloadavg()[0]:.1f}"
    )
    assert cpu["on"] / cpu["off"] < 1.5
    assert hooks_off < 20e-6  # two tests of a global and a shared context: nothing to export


def _hook_seconds(count: int) -> float:
    """The CPU time of one tool call's hooks (its task span, its tool span, its outcome)."""
    claimed = SimpleNamespace(run_id=uuid.uuid4(), task_id=1, key="a", kind="tool", attempt=1, spec={"tool": "test.echo"})
    started = time.process_time()
    for _ in range(count):
        with tracing.task_span(claimed), tracing.tool_span(claimed) as traced:
            traced.outcome(None)
    return (time.process_time() - started) / count
