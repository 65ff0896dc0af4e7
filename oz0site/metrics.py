"""GET /metrics: oz0 in Prometheus's text exposition format (version 0.0.4), for its installer.

Reached only with the metrics token (`Authorization: Bearer $OZ0_METRICS_TOKEN`, compared in
constant time) or from an address of OZ0_METRICS_ADDRESSES; anyone else, a signed-in person or
a person's API token included, gets the 404 every unknown path gets: the page does not say it exists.

Two sources: the run store's state, counted at scrape time (runs/gauges.py), with the brokers'
queue lengths; and what processes counted (oz0site/metering.py), read from Redis. The format is
written here by hand: `prometheus_client` is not among the installed packages, and the text
format is a few lines (HELP, TYPE, one sample a line, histograms as cumulative buckets).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import math
import time
from collections.abc import Iterable

import redis
from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.utils import timezone

from oz0site import metering
from oz0site.login import client_address
from runs.gauges import Labels, store_gauges

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# name: (type, help). The counters and histograms are the processes' (oz0site/metering.py).
PROCESS_FAMILIES = {
    "oz0_lease_expiries_total": (
        "counter",
        "Claims whose holder stopped heartbeating (kind=claim) and runner leases that ran out (kind=executor).",
    ),
    "oz0_sweep_duration_seconds": ("histogram", "How long each of beat's sweeps took, by sweep."),
    "oz0_webhook_failures_total": ("counter", "Notification webhooks that failed (refused address, error, non-2xx answer)."),
    "oz0_pruned_rows_total": ("counter", "Rows retention deleted, by table."),
    "oz0_http_request_duration_seconds": (
        "histogram",
        "Web requests' time from the first middleware to the answer, by method, route and status class.",
    ),
}


def allowed(request: HttpRequest) -> bool:
    token = str(settings.OZ0_METRICS_TOKEN)
    header = str(request.META.get("HTTP_AUTHORIZATION", ""))
    # Both sides as bytes: compare_digest takes only ASCII text, and a header may hold anything.
    if token and header.startswith("Bearer ") and hmac.compare_digest(header[len("Bearer ") :].strip().encode(), token.encode()):
        return True
    networks = settings.OZ0_METRICS_NETWORKS
    if not networks:
        return False
    try:
        address = ipaddress.ip_address(client_address(request))
    except ValueError:
        return False
    return any(address in network for network in networks)


def format_value(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def family(name: str, kind: str, help_text: str, lines: Iterable[str]) -> list[str]:
    return [f"# HELP {name} {escape_help(help_text)}", f"# TYPE {name} {kind}", *lines]


def gauge(name: str, help_text: str, values: dict[Labels, float]) -> list[str]:
    lines = (f"{name}{{{metering.label_text(labels)}}} {format_value(v)}" for labels, v in sorted(values.items()))
    return family(name, "gauge", help_text, lines)


def _sample(name: str, labels: str, bound: str, value: float) -> str:
    if bound:
        labels = f'{labels},le="{bound}"' if labels else f'le="{bound}"'
    return f"{name}{{{labels}}} {format_value(value)}"


BOUNDS = [metering.bucket_bound(b) for b in (*metering.LATENCY_BUCKETS, float("inf"))]


def histogram_lines(name: str, by_name: dict[str, list[tuple[str, str, float]]]) -> list[str]:
    """Each label set's buckets made cumulative (a stored bucket counts its own observations only)."""
    own: dict[str, dict[str, float]] = {}
    for labels, bound, v in by_name.get(f"{name}_bucket", []):
        own.setdefault(labels, {})[bound] = v
    sums = {labels: v for labels, _, v in by_name.get(f"{name}_sum", [])}
    counts = {labels: v for labels, _, v in by_name.get(f"{name}_count", [])}
    lines: list[str] = []
    for labels in sorted(own):
        seen, total = own[labels], 0.0
        for bound in BOUNDS:
            total += seen.get(bound, 0.0)
            lines.append(_sample(f"{name}_bucket", labels, bound, total))
        lines.append(_sample(f"{name}_sum", labels, "", sums.get(labels, 0.0)))
        lines.append(_sample(f"{name}_count", labels, "", counts.get(labels, 0.0)))
    return lines


def process_families(counted: dict[str, float]) -> list[str]:
    by_name: dict[str, list[tuple[str, str, float]]] = {}
    for text, value in counted.items():
        name, labels, bound = metering.split_field(text)
        by_name.setdefault(name, []).append((labels, bound, value))
    out: list[str] = []
    for name, (kind, help_text) in PROCESS_FAMILIES.items():
        if kind == "counter":
            lines = [_sample(name, labels, "", v) for labels, _, v in sorted(by_name.get(name, []))]
        else:
            lines = histogram_lines(name, by_name)
        out += family(name, kind, help_text, lines)
    return out


def render() -> str:
    started = time.perf_counter()
    store = store_gauges(timezone.now())
    lines = [
        *gauge(
            "oz0_tasks_ready", "Tasks ready for a worker and not yet claimed, by workspace and the queue they go to.", store.ready
        ),
        *gauge(
            "oz0_calls_running",
            "Tool calls and rounds held by a worker or a runner (running, dispatched), by workspace.",
            store.running,
        ),
        *gauge("oz0_session_slots_in_use", "Session threads harnessed rounds hold, by workspace.", store.sessions),
        *gauge("oz0_runs_held", "Runs held on a failure (needs_attention), by workspace.", store.held),
        *gauge("oz0_approvals_pending", "Calls waiting for a person's approval, by workspace.", store.approvals),
        *gauge(
            "oz0_approval_oldest_age_seconds",
            "How long the oldest pending approval has waited, by workspace.",
            store.oldest_approval_age,
        ),
    ]
    queues: tuple[str, str] = (str(settings.CELERY_TASK_DEFAULT_QUEUE), str(settings.OZ0_SESSION_QUEUE))
    try:
        counted, lengths = metering.read_all(queues)
        waiting: dict[Labels, float] = {(("queue", queue),): float(n) for queue, n in zip(queues, lengths, strict=True)}
        lines += gauge("oz0_broker_queue_messages", "Messages waiting in the broker's queue, by queue.", waiting)
        lines += process_families(counted)
        redis_up = 1.0
    except redis.RedisError as error:
        log.warning("metrics: Redis unreachable: %s", error)
        redis_up = 0.0
    lines += gauge(
        "oz0_metrics_redis_up", "1 when the scrape could read Redis (the broker's queues, the processes' counts).", {(): redis_up}
    )
    took = time.perf_counter() - started
    lines += gauge("oz0_metrics_scrape_seconds", "What building this page took.", {(): took})
    return "\n".join(lines) + "\n"


def metrics(request: HttpRequest) -> HttpResponse:
    """Anyone not allowed gets the 404 of an unknown path, whatever the method."""
    if not allowed(request):
        raise Http404
    if request.method != "GET":
        return HttpResponse(status=405, headers={"Allow": "GET"})
    return HttpResponse(render(), content_type=CONTENT_TYPE)
