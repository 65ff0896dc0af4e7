"""`runpage`: the run page of a 5,000-task run, today's page beside the new one (issue 30).

One run is seeded in the bench database the way the `fan` workload leaves one mid-way: a gate
(an await holding it open), 5,000 `test.echo` tasks (`e1`…: most completed, some running,
waiting or failed, each with its queued/started/finished stamps and usage) under the fan's tree
of `all` joins (157 + 5 + 1), and two or three trace events per task (added, started, settled),
written in bulk as the kernel would have left them (the tables ANALYZEd).

Two daphne processes serve the same database: this tree, and "today's page", the tree of
`OZ0_BENCH_RUNPAGE_BASE` (default: the last commit before issue 30's run page) exported with
`git archive` into a scratch directory. Both run production-shaped (DEBUG=0, their own
`collectstatic`). Each repetition measures both, in alternating order:

- server time and bytes: `GET /runs/<id>/` over one kept-alive localhost connection with an
  operator's session, to the last byte of the body;
- DOM nodes at first paint: headless Chromium (`/usr/bin/chromium`, Playwright) loads the page;
  elements counted at DOMContentLoaded, and the browser's own load time (navigation timing);
- a live change: with the page open and its websocket connected, the bench pauses (then
  resumes) the run through the kernel, stamps the commit (`on_commit`) and waits for the
  browser to show the new status (a MutationObserver stamps `#run-status` changing, in the
  browser's clock: the same machine's). Only one page is open at a time.
"""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.fan import join_tree
from bench.harness import ROOT, Processes, Profile, Section, bench_team, goal_at_most, say, summary

TASKS = {"full": 5000, "quick": 5000, "tiny": 150}
REPS = {"full": 5, "quick": 3, "tiny": 1}
BASE = os.environ.get("OZ0_BENCH_RUNPAGE_BASE", "c589d4e")
CHROMIUM = "/usr/bin/chromium"
WATCH = """() => {
  window.__changes = [];
  const body = document.getElementById("run-body");
  let last = (document.getElementById("run-status") || {}).textContent;
  new MutationObserver(() => {
    const status = document.getElementById("run-status");
    if (status && status.textContent !== last) {
      last = status.textContent;
      window.__changes.push([last, performance.timeOrigin + performance.now()]);
    }
  }).observe(body, {childList: true, subtree: true, characterData: true});
}"""


def seed(echoes: int) -> tuple[Any, Any]:
    from django.db import connection
    from django.utils import timezone

    from runs import kernel
    from runs.models import Run, Task, TraceEvent

    workspace, user = bench_team("runpage")
    run, _ = kernel.create_run(
        workspace=workspace, user=user, body={"tasks": [{"key": "gate", "kind": "await", "question": "held open"}]}
    )
    start = timezone.now() - timedelta(minutes=10)
    tasks, events = [], []
    seq = Run.objects.get(pk=run.pk).last_seq
    for i in range(1, echoes + 1):
        status = "failed" if i % 500 == 0 else "running" if i > echoes - 100 else "waiting" if i % 125 == 0 else "completed"
        queued = start + timedelta(seconds=540 * i / echoes)
        started = queued + timedelta(milliseconds=40) if status != "waiting" else None
        finished = started + timedelta(milliseconds=15) if status in ("completed", "failed") and started else None
        tasks.append(
            Task(
                run=run,
                key=f"e{i}",
                kind="tool",
                after=[],
                on_failure="absorb",
                spec={"tool": "test.echo", "args": {"value": i}},
                status=status,
                attempt=0 if status == "waiting" else 1,
                lineage=f"e{i}",
                result={"value": i, "usage": {"input_tokens": 0, "output_tokens": 0, "calls": 0}}
                if status == "completed"
                else None,
                error_key="tool_failed" if status == "failed" else None,
                error_detail="echo refused" if status == "failed" else None,
                ready=status == "waiting",
                queued_at=queued,
                started_at=started,
                finished_at=finished,
                position=i + 1,
            )
        )
        seq += 1
        events.append(
            TraceEvent(
                run=run,
                seq=seq,
                task_key=f"e{i}",
                event="task_added",
                to_status="waiting",
                data={"kind": "tool", "after": [], "on_failure": "absorb"},
            )
        )
        if started:
            seq += 1
            events.append(
                TraceEvent(
                    run=run,
                    seq=seq,
                    task_key=f"e{i}",
                    event="status",
                    from_status="waiting",
                    to_status="running",
                    data={"attempt": 1},
                )
            )
        if finished:
            seq += 1
            events.append(TraceEvent(run=run, seq=seq, task_key=f"e{i}", event="status", from_status="running", to_status=status))
    for offset, join in enumerate(join_tree([t.key for t in tasks])):
        tasks.append(
            Task(
                run=run,
                key=join["key"],
                kind="join",
                after=join["after"],
                spec={"mode": "all"},
                lineage=join["key"],
                position=echoes + 2 + offset,
            )
        )
    Task.objects.bulk_create(tasks, batch_size=2000)
    TraceEvent.objects.bulk_create(events, batch_size=5000)
    Run.objects.filter(pk=run.pk).update(last_seq=seq, created_at=start)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE runs_task")
        cursor.execute("ANALYZE runs_traceevent")
    say(f"runpage: seeded run {run.pk}: {len(tasks) + 1} tasks, {seq} trace events")
    return Run.objects.get(pk=run.pk), user


def export_base(into: Path) -> str:
    """Today's page: the tree at BASE, exported (never checked out: the worktree stays as it is)."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", BASE], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    archive = into / "base.tar"
    subprocess.run(["git", "archive", "--format=tar", "-o", str(archive), commit], cwd=ROOT, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    return commit


def collectstatic(procs: Processes, tree: Path) -> None:
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"], cwd=tree, env=procs.env.child_env, check=True
    )


def fetch(port: int, path: str, cookie: str) -> tuple[float, int]:
    """One GET to the last byte of its body, on a fresh localhost connection: (ms, bytes)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        started = time.perf_counter()
        connection.request("GET", path, headers={"Cookie": f"sessionid={cookie}"})
        response = connection.getresponse()
        body = response.read()
        ms = (time.perf_counter() - started) * 1000
    finally:
        connection.close()
    if response.status != 200:
        raise RuntimeError(f"bench: GET {path} on port {port} answered {response.status}")
    return ms, len(body)


def poll(page: Any, expression: str, timeout: float = 60.0) -> None:
    """Wait until `expression` holds in the page. Playwright's wait_for_function evaluates a string
    inside the page, which the console's CSP forbids; the instant that counts is stamped in the
    page by the MutationObserver, so how often this asks does not change the figure."""
    deadline = time.monotonic() + timeout
    while not page.evaluate(expression):
        if time.monotonic() > deadline:
            raise RuntimeError(f"bench: the page never showed {expression}")
        time.sleep(0.005)


DATABASE_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="runpage-db")


def change_status(run_id: Any, user: Any, *, pause: bool) -> float:
    """Pause (or resume) the run through the kernel; the instant its transaction committed (ms)."""
    from django.db import transaction

    from runs import kernel

    stamp: list[float] = []
    with transaction.atomic():
        transaction.on_commit(lambda: stamp.append(time.time() * 1000))
        if pause:
            kernel.pause_run(run_id=run_id, user=user)
        else:
            kernel.resume_run(run_id=run_id, user=user)
    return stamp[0]


def browse(browser: Any, port: int, path: str, cookie: str, run: Any, user: Any, changes: int) -> dict[str, Any]:
    """Load the page in a fresh context: elements at DOMContentLoaded, load time; then `changes`
    live changes (pause, resume, …), each from its commit to the browser showing it (ms)."""
    context = browser.new_context()
    context.add_cookies([{"name": "sessionid", "value": cookie, "domain": "127.0.0.1", "path": "/"}])
    page = context.new_page()
    try:
        page.goto(f"http://127.0.0.1:{port}{path}", wait_until="domcontentloaded", timeout=120_000)
        nodes = page.evaluate("document.getElementsByTagName('*').length")
        page.wait_for_load_state("load", timeout=120_000)
        load_ms = page.evaluate(
            "(() => { const n = performance.getEntriesByType('navigation')[0]; return n.loadEventEnd - n.startTime; })()"
        )
        poll(page, "document.body.classList.contains('live-on')")
        page.evaluate(WATCH)
        latencies = []
        for index in range(changes):
            # Playwright's sync API runs an event loop in this thread: the kernel is called from another.
            committed = DATABASE_THREAD.submit(change_status, run.pk, user, pause=index % 2 == 0).result()
            want = "paused" if index % 2 == 0 else "running"
            poll(page, f"window.__changes.some(c => c[0] === '{want}')")
            shown = page.evaluate(f"window.__changes.filter(c => c[0] === '{want}').pop()[1]")
            page.evaluate("window.__changes = []")
            latencies.append(shown - committed)
        if changes % 2:
            DATABASE_THREAD.submit(change_status, run.pk, user, pause=False).result()
        return {"nodes": nodes, "load_ms": load_ms, "live_ms": latencies}
    finally:
        context.close()


def run(profile: Profile, procs: Processes) -> Section:
    from django.test import Client
    from playwright.sync_api import sync_playwright

    run_row, user = seed(TASKS[profile.name])
    client = Client()
    client.force_login(user)
    cookie = client.cookies["sessionid"].value
    scratch = Path(tempfile.mkdtemp(prefix="oz0-runpage-"))
    commit = export_base(scratch)
    base_tree = scratch / "tree"
    collectstatic(procs, ROOT)
    collectstatic(procs, base_tree)
    ports = {"today": procs.web_server("daphne-today", cwd=base_tree)[0], "new": procs.web_server("daphne-new")[0]}
    say(f"runpage: today's page ({commit}) on port {ports['today']}, the new page on port {ports['new']}")
    path = f"/runs/{run_row.pk}/"
    figures: dict[str, dict[str, list[float]]] = {
        name: {"server_ms": [], "bytes": [], "nodes": [], "load_ms": [], "live_ms": []} for name in ports
    }
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--headless=new"], headless=True)
        try:
            for port in ports.values():  # warm: imports, templates, the first database sessions
                fetch(port, path, cookie)
            for rep in range(REPS[profile.name]):
                order = list(ports) if rep % 2 == 0 else list(reversed(ports))
                for name in order:
                    ms, size = fetch(ports[name], path, cookie)
                    seen = browse(browser, ports[name], path, cookie, run_row, user, changes=2)
                    figures[name]["server_ms"].append(ms)
                    figures[name]["bytes"].append(size)
                    figures[name]["nodes"].append(seen["nodes"])
                    figures[name]["load_ms"].append(seen["load_ms"])
                    figures[name]["live_ms"].extend(seen["live_ms"])
                    say(
                        f"runpage rep {rep} {name}: {ms:.0f} ms, {size / 1e6:.2f} MB, {seen['nodes']} elements, "
                        f"load {seen['load_ms']:.0f} ms, live {', '.join(f'{v:.0f}' for v in seen['live_ms'])} ms"
                    )
        finally:
            browser.close()
    section = Section()
    tasks = TASKS[profile.name] + len(join_tree([f"e{i}" for i in range(TASKS[profile.name])])) + 1
    for name, label in (("today", f"today's page ({commit})"), ("new", "the new page")):
        data = figures[name]
        section.figures[f"{label}: GET /runs/<id>/ ({tasks} tasks)"] = summary(data["server_ms"], "ms", digits=1)
        section.figures[f"{label}: bytes"] = summary(data["bytes"], "bytes", digits=0)
        section.figures[f"{label}: elements at first paint"] = summary(data["nodes"], "elements", digits=0)
        section.figures[f"{label}: browser load"] = summary(data["load_ms"], "ms", digits=0)
        section.figures[f"{label}: live change, commit to shown"] = summary(data["live_ms"], "ms", digits=0)
    new = section.figures
    section.goals.append(
        goal_at_most("server time, 5,000-task run", new[f"the new page: GET /runs/<id>/ ({tasks} tasks)"]["median"], 300, " ms")
    )
    section.goals.append(goal_at_most("elements at first paint", new["the new page: elements at first paint"]["median"], 3000))
    section.goals.append(
        goal_at_most("a live change reaches the page", new["the new page: live change, commit to shown"]["median"], 200, " ms")
    )
    return section
