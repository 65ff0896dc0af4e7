"""OpenTelemetry traces (issue 32, item 2; docs/tracing.md): a span per run, Celery message, task,
tool call, model request and harness session, in one trace per run across the web process, the
workers and the harness processes.

Off unless the installer's environment turns it on (`configured`): the standard `OTEL_*`
variables, read here and by the SDK, never a setting a person can change. Off, every hook below
is one test of a module global and hands back a shared do-nothing context: no OpenTelemetry
module is imported by this one (`setup` imports the SDK, and only when it is on).

**One trace per run.** A run lives longer than any request and its work is sent by requests, by
workers and by beat's sweeps, so its trace is not the one of whoever sent its first message: the
trace id is the run's UUID and the run's span id is derived from it (`run_context`). Every process
can therefore put a task's span under its run with nothing but the run's id, and the run's own
span is written once, when the run finishes (after the commit that finished it: the kernel saves
the run's row, and Django's `post_save` says so), from its creation to its end. The context of
whoever sent a Celery message travels in the message's headers (`traceparent`, W3C trace context)
and becomes a link of the span that processes it: the request that created a run, the task whose
report made the next ready, the person's approval. A harness process gets its session's span context in the
`start` message (`traceparent`), to hang its own spans under it.

Spans hold ids, names, counts, keys and outcomes: never a run's input or output, a tool's
arguments or result, a prompt, or an error's words (F11).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, SpanContext, Tracer

log = logging.getLogger(__name__)

# True once `setup` installed a tracer; every hook tests it first.
ACTIVE = False
_provider: TracerProvider | None = None
_tracer: Tracer | None = None
_disconnect: list[Callable[[], None]] = []
_setup_lock = threading.Lock()

# The Celery tasks whose second argument (or `run_id`) names the run they work for.
RUN_TASKS = frozenset({"runs.tasks.execute_task", "runs.tasks.execute_batch", "runs.tasks.execute_session"})


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def configured(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the installer's environment asks for traces: an exporter named in
    OTEL_TRACES_EXPORTER (other than `none`), or an OTLP endpoint; never with OTEL_SDK_DISABLED=true.
    Nothing set: off (the SDK's own default exporter, `otlp` to localhost, is not assumed)."""
    if _true(environ.get("OTEL_SDK_DISABLED")):
        return False
    exporters = _exporter_names(environ)
    if exporters:
        return exporters != ["none"]
    return bool(environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def _exporter_names(environ: Mapping[str, str]) -> list[str]:
    return [name.strip().lower() for name in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if name.strip()]


# ---- set-up (once per process, at its start) ----


def setup(role: str, *, exporter: SpanExporter | None = None, environ: Mapping[str, str] = os.environ) -> bool:
    """Turn traces on in this process (`role`: web, worker, beat) when the environment asks for them;
    whether they are on. `exporter` is a test's own (the SDK's in-memory one), written through
    synchronously; the installer's exporters are written through a batch processor's thread, so no
    span is ever exported inside a request's or a transaction's time."""
    global ACTIVE, _provider, _tracer
    if exporter is None and not configured(environ):
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    with _setup_lock:
        teardown()
        attributes: dict[str, str] = {"oz0.process": role}
        named = environ.get("OTEL_SERVICE_NAME") or "service.name=" in environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
        if not named:
            attributes["service.name"] = "oz0"
        provider = TracerProvider(resource=Resource.create(attributes), id_generator=_run_ids())
        if exporter is not None:
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        else:
            for installed in _installed_exporters(environ):
                provider.add_span_processor(BatchSpanProcessor(installed))
        _provider = provider
        _tracer = provider.get_tracer("oz0")
        _connect()
        ACTIVE = True
    return True


def _installed_exporters(environ: Mapping[str, str]) -> list[SpanExporter]:
    """The exporters OTEL_TRACES_EXPORTER names (`otlp` when only an endpoint is set): OTLP over
    HTTP/protobuf (its endpoint, headers and timeout from the OTEL_EXPORTER_OTLP_* variables, read
    by the exporter itself) and `console`."""
    names = _exporter_names(environ) or ["otlp"]
    exporters: list[SpanExporter] = []
    for name in names:
        if name == "otlp":
            protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            if protocol and protocol != "http/protobuf":
                log.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s is not installed: traces go over http/protobuf", protocol)
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter())
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporters.append(ConsoleSpanExporter())
        elif name != "none":
            log.warning("OTEL_TRACES_EXPORTER names %r, which oz0 does not install (otlp, console, none)", name)
    return exporters


def _connect() -> None:
    """The hooks tracing needs outside this module, connected only while it is on."""
    from celery import signals
    from django.db.models.signals import post_save

    from runs.models import Run

    signals.before_task_publish.connect(_message_sent, weak=False, dispatch_uid="oz0-tracing-publish")
    signals.task_prerun.connect(_message_taken, weak=False, dispatch_uid="oz0-tracing-prerun")
    signals.task_postrun.connect(_message_done, weak=False, dispatch_uid="oz0-tracing-postrun")
    signals.worker_process_shutdown.connect(_flush_at_exit, weak=False, dispatch_uid="oz0-tracing-shutdown")
    post_save.connect(_run_saved, sender=Run, weak=False, dispatch_uid="oz0-tracing-run-saved")

    def disconnect() -> None:
        signals.before_task_publish.disconnect(dispatch_uid="oz0-tracing-publish")
        signals.task_prerun.disconnect(dispatch_uid="oz0-tracing-prerun")
        signals.task_postrun.disconnect(dispatch_uid="oz0-tracing-postrun")
        signals.worker_process_shutdown.disconnect(dispatch_uid="oz0-tracing-shutdown")
        post_save.disconnect(sender=Run, dispatch_uid="oz0-tracing-run-saved")

    _disconnect.append(disconnect)


def teardown() -> None:
    """Traces off again (tests): hooks disconnected, spans held flushed."""
    global ACTIVE, _provider, _tracer
    ACTIVE = False
    while _disconnect:
        _disconnect.pop()()
    if _provider is not None:
        _provider.shutdown()
    _provider = _tracer = None


def flush(timeout_seconds: float = 5.0) -> None:
    if _provider is not None:
        _provider.force_flush(int(timeout_seconds * 1000))


def _flush_at_exit(**kwargs: Any) -> None:
    """A prefork child's spans leave before it exits (its batch thread would die with it)."""
    flush()


# ---- the run's trace ----

_forced_ids: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("oz0_forced_ids", default=None)


def _run_ids() -> Any:
    """The SDK's random ids, except while the run's own span is made: then the run's."""
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class RunIds(RandomIdGenerator):
        def generate_trace_id(self) -> int:
            forced = _forced_ids.get()
            return forced[0] if forced else super().generate_trace_id()

        def generate_span_id(self) -> int:
            forced = _forced_ids.get()
            return forced[1] if forced else super().generate_span_id()

    return RunIds()


def run_ids(run_id: Any) -> tuple[int, int]:
    """The trace id (the run's UUID) and the run span's id (from a hash of it; never 0)."""
    key = run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id))
    span_id = int.from_bytes(hashlib.sha256(b"oz0-run:" + key.bytes).digest()[:8], "big") or 1
    return key.int or 1, span_id


def run_context(run_id: Any) -> SpanContext:
    """The run's span as a parent any process can name (remote: its span is written elsewhere)."""
    from opentelemetry.trace import SpanContext, TraceFlags

    trace_id, span_id = run_ids(run_id)
    assert _provider is not None
    sampled = _provider.sampler.should_sample(None, trace_id, "run").decision.is_sampled()
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED if sampled else 0))


def _under_run(run_id: Any) -> Any:
    """The parent context for work of this run: the current span when it is in the run's trace
    (a task under its message's span), else the run's span."""
    from opentelemetry import trace

    current = trace.get_current_span().get_span_context()
    if run_id is None:
        return None
    try:
        parent = run_context(run_id)
    except (ValueError, TypeError):
        return None
    if current.is_valid and current.trace_id == parent.trace_id:
        return None  # the current context
    return trace.set_span_in_context(trace.NonRecordingSpan(parent))


def _run_saved(sender: Any = None, instance: Any = None, update_fields: Any = None, **kwargs: Any) -> None:
    """The kernel saves a run's row with the fields its transaction changed (runs/kernel/commit.py,
    the one place it does): a save that moved its status to a finished one is the run's end, and
    its span is written once that transaction commits. The kernel itself knows nothing of traces."""
    from django.db import transaction

    from runs.models import RUN_FINISHED

    if instance is not None and update_fields and "status" in update_fields and instance.status in RUN_FINISHED:
        transaction.on_commit(partial(run_finished, instance), robust=True)


def run_finished(run: Any) -> None:
    """The run's own span, from its creation to its end, written by the process that finished it
    (after the commit that finished it)."""
    if not ACTIVE or _tracer is None:
        return
    from opentelemetry.context import Context
    from opentelemetry.trace import Link

    # A child run (delegation) is a trace of its own, linked to its parent's.
    links = [Link(run_context(run.parent_id))] if getattr(run, "parent_id", None) else None
    token = _forced_ids.set(run_ids(run.pk))
    try:
        span = _tracer.start_span(
            "run", context=Context(), start_time=_nanos(run.created_at), attributes=_run_attributes(run), links=links
        )
    finally:
        _forced_ids.reset(token)
    span.set_attribute("oz0.run.status", str(run.status))
    failure = run.failure if isinstance(getattr(run, "failure", None), dict) else None
    if failure and failure.get("kind"):
        span.set_attribute("oz0.failure.kind", str(failure["kind"])[:100])
    span.end(end_time=_nanos(run.finished_at) if run.finished_at else None)


def _run_attributes(run: Any) -> dict[str, Any]:
    attributes = {"oz0.run.id": str(run.pk), "oz0.workspace.id": int(run.workspace_id), "oz0.agent.name": str(run.agent_name)}
    if getattr(run, "parent_id", None):
        attributes["oz0.run.parent"] = str(run.parent_id)
    return attributes


def _nanos(moment: Any) -> int:
    return int(moment.timestamp() * 1_000_000_000)


# ---- the hooks the worker calls (each one test of ACTIVE when off) ----


class _Nothing:
    """What a hook's `with` gives when traces are off: every report is ignored."""

    def outcome(self, error: str | None = None, *, stopped: bool = False) -> None:
        pass

    def answered(self, usage: Mapping[str, Any] | None, finish: str | None) -> None:
        pass


class _Traced(_Nothing):
    def __init__(self, span: Span) -> None:
        self.span = span

    def outcome(self, error: str | None = None, *, stopped: bool = False) -> None:
        from opentelemetry.trace import Status, StatusCode

        if stopped:
            self.span.set_attribute("oz0.outcome", "stopped")
        elif error:
            self.span.set_attribute("oz0.outcome", "error")
            self.span.set_attribute("error.type", error[:100])
            self.span.set_status(Status(StatusCode.ERROR))
        else:
            self.span.set_attribute("oz0.outcome", "ok")

    def answered(self, usage: Mapping[str, Any] | None, finish: str | None) -> None:
        _usage_attributes(self.span, usage)
        if finish:
            self.span.set_attribute("gen_ai.response.finish_reasons", [str(finish)[:40]])


NOTHING = _Nothing()
_OFF: contextlib.nullcontext[_Nothing] = contextlib.nullcontext(NOTHING)


@contextlib.contextmanager
def _span(name: str, attributes: dict[str, Any], *, run_id: Any = None, kind: Any = None, links: Any = None) -> Iterator[_Traced]:
    from opentelemetry.trace import SpanKind, Status, StatusCode

    assert _tracer is not None
    with _tracer.start_as_current_span(
        name,
        context=_under_run(run_id),
        kind=kind or SpanKind.INTERNAL,
        attributes=attributes,
        links=links,
        record_exception=False,  # an exception's words may be the run's: only its type is kept
        set_status_on_exception=False,
    ) as span:
        try:
            yield _Traced(span)
        except BaseException as error:
            span.set_attribute("error.type", type(error).__name__)
            span.set_status(Status(StatusCode.ERROR))
            raise


def _task_attributes(claimed: Any) -> dict[str, Any]:
    return {
        "oz0.run.id": str(claimed.run_id),
        "oz0.task.id": int(claimed.task_id),
        "oz0.task.key": str(claimed.key),
        "oz0.task.kind": str(claimed.kind),
        "oz0.task.attempt": int(claimed.attempt),
    }


def task_span(claimed: Any) -> contextlib.AbstractContextManager[_Nothing]:
    """One claimed task of a run, from its claim to its report."""
    if not ACTIVE:
        return _OFF
    return _span(f"task {claimed.kind}", _task_attributes(claimed), run_id=claimed.run_id)


def tool_span(claimed: Any) -> contextlib.AbstractContextManager[_Nothing]:
    """A worker tool's call (its outcome told with `outcome`)."""
    if not ACTIVE:
        return _OFF
    name = str(claimed.spec.get("tool", ""))[:200]
    attributes = {**_task_attributes(claimed), "oz0.tool.name": name, "gen_ai.tool.name": name}
    return _span(f"tool {name}", attributes, run_id=claimed.run_id)


def harness_span(claimed: Any, kind: str) -> contextlib.AbstractContextManager[_Nothing]:
    """A harnessed round's session (F7): its process hangs its own spans under it (`carrier`)."""
    if not ACTIVE:
        return _OFF
    return _span(f"harness {kind}", {**_task_attributes(claimed), "oz0.harness.kind": kind}, run_id=claimed.run_id)


def model_request(route: str, attempt: int) -> contextlib.AbstractContextManager[_Nothing]:
    """One request of oz0's own loop to a model provider (its answer told with `answered`)."""
    if not ACTIVE:
        return _OFF
    provider, _, model = route.partition(":")
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": model or provider,
        "oz0.route": route,
        "oz0.attempt": attempt,
    }
    return _span(f"chat {model or provider}", attributes)


def current_context() -> Any:
    """The current context (a harness session's, kept with it), or None when traces are off."""
    if not ACTIVE:
        return None
    from opentelemetry import context

    return context.get_current()


def model_request_reported(entry: Mapping[str, Any], parent: Any = None) -> None:
    """A model request a harness reported as it ended (its `usage` message): a span ending now and
    lasting its `duration_ms`, under the harness session's span (`parent`, the session's context)."""
    if not ACTIVE or _tracer is None:
        return
    from opentelemetry.trace import Status, StatusCode

    now = time.time_ns()
    duration = entry.get("duration_ms")
    start = now - int(duration) * 1_000_000 if isinstance(duration, int) else now
    model = entry.get("model") or entry.get("route") or "unknown"
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": str(model),
        "oz0.route": str(entry.get("route")),
    }
    if entry.get("provider"):
        attributes["gen_ai.provider.name"] = str(entry["provider"])
    if entry.get("calls"):
        attributes["oz0.requests"] = int(entry["calls"])
    span = _tracer.start_span(f"chat {model}", context=parent, start_time=start, attributes=attributes)
    _usage_attributes(span, entry.get("usage"))
    if entry.get("finish"):
        span.set_attribute("gen_ai.response.finish_reasons", [str(entry["finish"])])
    if entry.get("outcome") == "error":
        span.set_attribute("error.type", str(entry.get("exception") or "error"))
        span.set_status(Status(StatusCode.ERROR))
    span.end(end_time=now)


def _usage_attributes(span: Span, usage: Mapping[str, Any] | None) -> None:
    for key in ("input_tokens", "output_tokens"):
        value = (usage or {}).get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            span.set_attribute(f"gen_ai.usage.{key}", value)


def carrier(context: Any = None) -> dict[str, str]:
    """A context's span (the current one's by default) as W3C trace-context fields (`traceparent`,
    `tracestate`), for a harness's `start` message; empty when traces are off."""
    if not ACTIVE:
        return {}
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    fields: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(fields, context=context)
    return fields


# ---- Celery: the context in the message, a span where it is processed ----

_taken: dict[str, tuple[Any, Any]] = {}


def _message_sent(sender: Any = None, headers: dict[str, Any] | None = None, **kwargs: Any) -> None:
    """The sender's context in the message's headers (the worker links its span to it)."""
    if not ACTIVE or headers is None:
        return
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    TraceContextTextMapPropagator().inject(headers)


def _message_taken(task_id: str | None = None, task: Any = None, args: Any = None, kwargs: Any = None, **extra: Any) -> None:
    """A span for the message this worker processes: under its run's span, linked to its sender.
    A message with neither (beat's ticks, sweeps) gets none."""
    if not ACTIVE or _tracer is None or task is None or task_id is None:
        return
    from opentelemetry import context, trace
    from opentelemetry.trace import Link, SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    request = getattr(task, "request", None)
    fields = {name: value for name in ("traceparent", "tracestate") if isinstance(value := getattr(request, name, None), str)}
    sent = trace.get_current_span(TraceContextTextMapPropagator().extract(fields)).get_span_context() if fields else None
    run_id = _run_of(task.name, args or (), kwargs or {})
    if run_id is None and sent is None:
        return
    links = [Link(sent)] if sent is not None and sent.is_valid else None
    if run_id is not None:
        parent = _under_run(run_id)
    else:
        assert sent is not None
        parent = trace.set_span_in_context(trace.NonRecordingSpan(sent))
    attributes = {"messaging.system": "celery", "messaging.operation.type": "process", "messaging.message.id": task_id}
    if run_id is not None:
        attributes["oz0.run.id"] = str(run_id)
    span = _tracer.start_span(task.name, context=parent, kind=SpanKind.CONSUMER, attributes=attributes, links=links)
    _taken[task_id] = (span, context.attach(trace.set_span_in_context(span)))


def _run_of(name: str, args: Any, kwargs: Mapping[str, Any]) -> Any:
    if name not in RUN_TASKS:
        return None
    run_id = kwargs.get("run_id", args[1] if len(args) > 1 else None)
    try:
        return uuid.UUID(str(run_id)) if run_id is not None else None
    except ValueError:
        return None


def _message_done(task_id: str | None = None, state: str | None = None, **kwargs: Any) -> None:
    taken = _taken.pop(task_id or "", None)
    if taken is None:
        return
    from opentelemetry import context

    span, token = taken
    if state:
        span.set_attribute("oz0.celery.state", str(state))
    span.end()
    with contextlib.suppress(ValueError):  # a token from another context: nothing to restore
        context.detach(token)


# ---- the web process ----


class TracingMiddleware:
    """A span per web request (first in MIDDLEWARE, added only when traces are on): the request
    that creates a run or decides an approval is the link of the work it sends. Its name is the
    URL pattern, never the path (which may carry names); an incoming `traceparent` is not
    followed: a client does not choose oz0's traces."""

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        if not ACTIVE or _tracer is None:
            return self.get_response(request)
        from opentelemetry.context import Context
        from opentelemetry.trace import SpanKind, Status, StatusCode

        method = request.method if request.method in {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"} else "_OTHER"
        with _tracer.start_as_current_span(
            method, context=Context(), kind=SpanKind.SERVER, attributes={"http.request.method": method}
        ) as span:
            response = self.get_response(request)
            match = getattr(request, "resolver_match", None)
            route = getattr(match, "route", None)
            if route is not None:
                span.update_name(f"{method} /{route}")
                span.set_attribute("http.route", f"/{route}")
            span.set_attribute("http.response.status_code", response.status_code)
            if response.status_code >= 500:
                span.set_status(Status(StatusCode.ERROR))
            return response
