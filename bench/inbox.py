"""`inbox`: the inbox's first page with 10,000 pending approvals: server time and query count.

100 runs are created through the kernel (each held open by an await); the 10,000 approvals
(model-composed `test.echo` calls in `needs_approval`, an hour's spread of `queued_at`) are
written in bulk straight into the task table, as the kernel would have left them, and the
table is ANALYZEd. Then, interleaved in each repetition: `inbox.selectors.inbox_items` (the
first page of 50), `GET /api/v1/inbox` through Django's full stack (bearer token), and the
console page `/w/<slug>/inbox/` when the console has one. Times are wall-clock in-process;
queries are counted on the connection.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from bench.harness import Profile, QueryCounter, Section, bench_team, goal_at_most, say, summary

RUNS = 100


def seed(rows: int) -> tuple[Any, Any, str]:
    from django.db import connection
    from django.utils import timezone

    from runs import kernel
    from runs.models import Task
    from tenancy.models import ApiToken
    from tenancy.tokens import token_digest

    workspace, user = bench_team("inbox")
    token = secrets.token_urlsafe(32)
    ApiToken.objects.create(user=user, digest=token_digest(token), label="bench")
    runs = []
    for _ in range(min(RUNS, rows)):
        run, _ = kernel.create_run(
            workspace=workspace,
            user=user,
            body={"tasks": [{"key": "gate", "kind": "await", "question": "held open"}], "approval": {"mode": "ask"}},
        )
        runs.append(run)
    now = timezone.now()
    per_run = -(-rows // len(runs))
    batch = []
    for index in range(rows):
        run = runs[index % len(runs)]
        queued = now - timedelta(seconds=3600 * (rows - index) / rows)
        batch.append(
            Task(
                run=run,
                key=f"r1.{index // len(runs) + 1}",
                kind="tool",
                after=[],
                on_failure="absorb",
                spec={"tool": "test.echo", "args": {"value": index}},
                status="needs_approval",
                lineage="r1",
                composed=True,
                queued_at=queued,
                deadline_at=queued + timedelta(hours=24),
                position=index // len(runs) + 2,
            )
        )
    Task.objects.bulk_create(batch, batch_size=2000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE runs_task")
        cursor.execute("ANALYZE runs_run")
    say(f"inbox: seeded {rows} pending approvals over {len(runs)} runs ({per_run} each)")
    return workspace, user, token


def timed(call: Callable[[], Any]) -> tuple[float, int, Any]:
    with QueryCounter() as queries:
        started = time.perf_counter()
        value = call()
        ms = (time.perf_counter() - started) * 1000
    return ms, queries.count, value


def console_path(slug: str) -> str | None:
    from django.urls import Resolver404, resolve

    path = f"/w/{slug}/inbox/"
    try:
        resolve(path)
    except Resolver404:
        return None
    return path


def run(profile: Profile) -> Section:
    from django.test import Client

    from inbox.selectors import inbox_items

    workspace, user, token = seed(profile.inbox_rows)
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    console = Client()
    console.force_login(user)
    page_path = console_path(workspace.slug)

    def selector() -> Any:
        page = inbox_items(user)
        if len(page["items"]) != min(50, profile.inbox_rows):
            raise RuntimeError(f"bench: the inbox's first page holds {len(page['items'])} items")
        return page

    def api_call() -> Any:
        response = api.get("/api/v1/inbox")
        if response.status_code != 200:
            raise RuntimeError(f"bench: GET /api/v1/inbox answered {response.status_code}")
        return response

    def page_call() -> Any:
        assert page_path is not None
        response = console.get(page_path)
        if response.status_code != 200:
            raise RuntimeError(f"bench: GET {page_path} answered {response.status_code}")
        return response

    probes: list[tuple[str, Callable[[], Any]]] = [("selector", selector), ("api", api_call)]
    if page_path:
        probes.append(("page", page_call))
    for _, probe in probes:
        probe()  # warm: imports, URL resolvers, template loading
    ms: dict[str, list[float]] = {name: [] for name, _ in probes}
    counts: dict[str, list[int]] = {name: [] for name, _ in probes}
    for rep in range(profile.inbox_reps):
        for name, probe in probes[rep % len(probes) :] + probes[: rep % len(probes)]:
            elapsed, count, _ = timed(probe)
            ms[name].append(elapsed)
            counts[name].append(count)
    say("inbox: " + ", ".join(f"{name} {sorted(v)[len(v) // 2]:.1f} ms / {counts[name][0]} queries" for name, v in ms.items()))
    section = Section()
    rows = profile.inbox_rows
    section.figures[f"inbox_items first page ({rows} pending)"] = summary(ms["selector"], "ms", digits=1)
    section.figures["inbox_items queries"] = summary(counts["selector"], "queries", digits=0)
    section.figures["GET /api/v1/inbox"] = summary(ms["api"], "ms", digits=1)
    section.figures["GET /api/v1/inbox queries"] = summary(counts["api"], "queries", digits=0)
    if page_path:
        section.figures["console /w/<slug>/inbox/"] = summary(ms["page"], "ms", digits=1)
        section.figures["console page queries"] = summary(counts["page"], "queries", digits=0)
    else:
        section.notes.append("the console has no /w/<slug>/inbox/ page yet: only the selector and the API were timed")
    section.goals.append(goal_at_most("first page, server time (API)", section.figures["GET /api/v1/inbox"]["median"], 50, " ms"))
    if page_path:
        section.goals.append(
            goal_at_most("first page, server time (console)", section.figures["console /w/<slug>/inbox/"]["median"], 50, " ms")
        )
    return section
