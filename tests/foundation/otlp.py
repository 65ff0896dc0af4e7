"""Helpers of the tracing tests (docs/tracing.md): the SDK's in-memory exporter, an OTLP/HTTP
receiver served on loopback (its protobuf decoded with opentelemetry-proto), and a live stack of
this test's own whose processes export to it."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from oz0site import tracing
from runs.models import Run
from tests.conftest import LiveStack, _database_url, wait_for


@contextmanager
def in_memory() -> Iterator[InMemorySpanExporter]:
    """Traces on in this process, written to the SDK's in-memory exporter."""
    exporter = InMemorySpanExporter()
    tracing.setup("test", exporter=exporter, environ={})
    try:
        yield exporter
    finally:
        tracing.teardown()


def by_name(found: Any) -> dict[str, list[ReadableSpan]]:
    named: dict[str, list[ReadableSpan]] = {}
    for span in found:
        named.setdefault(span.name, []).append(span)
    return named


def in_one_tree(run: Run, found: Any) -> None:
    """Every span of the run is in its trace, and hangs (through its parents) from its run span."""
    trace_id, run_span_id = tracing.run_ids(run.pk)
    ids = {span.context.span_id for span in found}
    assert run_span_id in ids
    for span in found:
        assert span.context.trace_id == trace_id, span.name
        if span.context.span_id != run_span_id:
            assert span.parent is not None and span.parent.span_id in ids, span.name


def hex_ids(run: Run) -> tuple[str, str]:
    """The run's trace id and its span's id as OTLP carries them (hex)."""
    trace_id, span_id = tracing.run_ids(run.pk)
    return f"{trace_id:032x}", f"{span_id:016x}"


class Receiver:
    """An OTLP/HTTP trace receiver: POST /v1/traces, protobuf bodies decoded with opentelemetry-proto."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.add(self.path, request)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, path: str, request: ExportTraceServiceRequest) -> None:
        assert path == "/v1/traces", path
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    attributes = {a.key: a.value.string_value or a.value.int_value for a in span.attributes}
                    with self.lock:
                        self.spans.append(
                            {
                                "name": span.name,
                                "trace": span.trace_id.hex(),
                                "id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex(),
                                "links": [(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                                "process": resource.get("oz0.process"),
                                "service": resource.get("service.name"),
                                "attributes": attributes,
                            }
                        )

    def found(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.spans)

    def of_run(self, run: Run) -> list[dict[str, Any]]:
        trace_id, _ = hex_ids(run)
        return [span for span in self.found() if span["trace"] == trace_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def receiving() -> Iterator[Receiver]:
    serving = Receiver()
    try:
        yield serving
    finally:
        serving.close()


@contextmanager
def traced_stack(receiver: Receiver, monkeypatch: pytest.MonkeyPatch, settings: Any) -> Iterator[LiveStack]:
    """This test's own workers on a queue of their own, and this process as the web process, all
    tracing to `receiver` through the OTEL_* variables an installer would set."""
    from oz0site.celery import app as celery_app

    queue = f"oz0-trace-{uuid.uuid4().hex[:8]}"
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_SERVICE_NAME": "oz0-test", "OTEL_BSP_SCHEDULE_DELAY": "100"}
    workdir = Path(tempfile.mkdtemp(prefix="i32-otel-live-"))
    env = {
        **os.environ,
        **otel,
        "DATABASE_URL": _database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "OZ0_QUEUE": queue,
        "OZ0_TEST_TOOLS": "1",
        "DEBUG": "1",
        "PYTHONUNBUFFERED": "1",
    }
    stack = LiveStack(env, workdir)
    session_queue = celery_app.conf.task_default_queue
    celery_app.conf.task_default_queue = queue
    settings.CELERY_TASK_DEFAULT_QUEUE = queue
    settings.OZ0_SESSION_QUEUE = f"{queue}.sessions"
    settings.MIDDLEWARE = ["oz0site.tracing.TracingMiddleware", *settings.MIDDLEWARE]
    for name, value in otel.items():
        monkeypatch.setenv(name, value)
    assert tracing.setup("web")
    try:
        yield stack
    finally:
        celery_app.conf.task_default_queue = session_queue
        tracing.teardown()
        stack.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def wait_until_serving(stack: LiveStack, *, sessions: bool = False) -> None:
    """Until this stack's workers answer a ping. Before it, the session's own beat would find the
    test's ready calls unclaimed past its requeue time and send them to the session's untraced
    worker (a loaded machine starts a worker in seconds)."""
    from oz0site.celery import app as celery_app

    def serving() -> bool:
        names = [name for reply in celery_app.control.ping(timeout=1.0) for name in reply]
        mine = [name for name in names if name.startswith(f"{stack.queue}-")]
        session_workers = [name for name in mine if name.startswith(f"{stack.queue}-sessions-")]
        return len(mine) > len(session_workers) and (bool(session_workers) or not sessions)

    wait_for(serving, timeout=120, message=f"the traced workers to answer a ping\n{stack.logs()}")
