"""`manage.py demo`: the demo workspace, a user for each role, and runs in every interesting state.

Idempotent: users keep their passwords (derived from SECRET_KEY, so they are stable for an
install and printed each time), and each demo run is created once (marked by `input.demo`).
Runs are created through the kernel; the worker moves them into their states once it runs.
They use only what every install has (the `script` model provider, `clock.now`, the runner
tool `shell.echo`), never the `test.*` tools, so a real install can load the demo:

- completed: clock.now, then a round that answers
- running: a shell.echo call waiting for a runner (`./oz0 runner` serves it)
- awaiting approval: a round under approval mode `ask` that calls clock.now
- asking a question: a round that answers {"ask": ...}
- held: a round whose model route answers 401, with on_failure `halt`
- canceled with a typed failure: a round calling oz.fail with a kind it never declared

When `oz0agents/examples/` holds manifests, they are registered as the demo workspace's agents and each
that runs offline gets one run.

History: two demo agents (`history-invoices`, `history-router`) with four weeks of runs, each
version better or worse than the one before, a few holds abandoned by the operator a day later, so the Agents page and the scorecards have something
to show on a first look. Every history run says "demo history" in its input. The runs are created
by `kernel.create_run` and driven in this process exactly as a worker drives them (the kernel's
claim, `runs.worker.execution.execute_claimed`, the script provider), so their findings and the
rollups come from the kernel and the database triggers. Only the clock is moved: each day's runs
are created and driven under `time_machine.travel` to that day, so every timestamp they carry
(run, tasks, trace, finding, and the versions registered that day) is that day's, consistently.
While they load, the kernel's Celery sender is swapped for none, so no worker picks them up with
today's clock.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import random
import threading
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import yaml
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.utils import timezone

from oz0agents.lint import InvalidManifest
from oz0agents.registry import register
from runs import kernel
from runs.models import Run, RunStatus, Task
from runs.worker.execution import execute_claimed
from tenancy.models import Membership, Role, Workspace

WORKSPACE = "demo"
ROLES = (Role.OPERATOR, Role.READER, Role.VIEWER)
AGENTS_DIR = Path(settings.BASE_DIR) / "oz0agents" / "examples"

DEMO_RUNS: list[tuple[str, dict[str, Any]]] = [
    (
        "completed",
        {
            "tasks": [
                {"key": "clock", "kind": "tool", "tool": "clock.now", "args": {}},
                {
                    "key": "greet",
                    "kind": "round",
                    "model": "script",
                    "prompt": "Greet the person trying oz0.",
                    "script": [{"text": "hello from the demo"}],
                    "after": ["clock"],
                },
            ],
            "deliverable": "greet",
            "approval": {"mode": "bypass"},
        },
    ),
    (
        "running",
        {
            "tasks": [
                {
                    "key": "on-runner",
                    "kind": "tool",
                    "tool": "shell.echo",
                    "args": {"text": "hello from a runner"},
                }
            ],
            "approval": {"mode": "bypass"},
        },
    ),
    (
        "awaiting-approval",
        {
            "tasks": [
                {
                    "key": "deploy",
                    "kind": "round",
                    "model": "script",
                    "prompt": "Deploy the release to staging once it is time.",
                    "tools": ["clock.now"],
                    "script": [
                        {"tool_calls": [{"tool": "clock.now", "args": {}}]},
                        {"text": "Release 1.4 is on staging."},
                    ],
                }
            ],
            "approval": {"mode": "ask"},
        },
    ),
    (
        "asking",
        {
            "tasks": [
                {
                    "key": "report",
                    "kind": "round",
                    "model": "script",
                    "prompt": "Write the weekly sales report.",
                    "script": [{"ask": "Which region should the report cover?"}, {"text": "Here is the report for that region."}],
                }
            ],
            "approval": {"mode": "bypass"},
        },
    ),
    (
        "held",
        {
            "tasks": [
                {
                    "key": "fetch",
                    "kind": "round",
                    "model": "script",
                    "prompt": "Fetch the open incidents from the tracker.",
                    "script": [{"http": 401}],
                    "on_failure": "halt",
                },
                {"key": "summarize", "kind": "tool", "tool": "clock.now", "args": {}, "after": ["fetch"]},
            ],
            "approval": {"mode": "bypass"},
        },
    ),
    (
        "canceled",
        {
            "tasks": [
                {
                    "key": "lookup",
                    "kind": "round",
                    "model": "script",
                    "prompt": "Look up issue 404.",
                    "tools": ["oz.fail"],
                    "script": [{"oz_fail": {"kind": "no_such_issue", "message": "issue 404 does not exist"}}],
                }
            ],
            "approval": {"mode": "bypass"},
        },
    ),
]


HISTORY_MARKER = "history"
HISTORY_DAYS = 28


def history_manifest(name: str, version: int, kinds: list[tuple[str, str]]) -> str:
    failures = "".join(f"  - kind: {kind}\n    description: {text}\n" for kind, text in kinds)
    return (
        f"name: {name}\ndescription: demo history (runs with past timestamps), version {version}\nmodel: script\n"
        f"instructions: version {version} of a demo agent whose past runs fill the Agents page.\n"
        f"tools: [oz.fail]\nfailures:\n{failures}approval:\n  mode: bypass\n"
    )


# Per agent: its versions, each from a day (days ago) with the chance of each outcome per run:
# a kind it fails with (oz.fail), `auth` (a model route answering 401: the kernel holds the run, and an
# operator abandons it the next day), or success.
HISTORY: list[tuple[str, list[tuple[str, str]], list[tuple[int, dict[str, float]]]]] = [
    (
        "history-invoices",
        [("unreadable", "The invoice scan could not be read"), ("missing_total", "The invoice has no total")],
        [
            (28, {"unreadable": 0.3, "missing_total": 0.15, "auth": 0.05}),
            (18, {"unreadable": 0.08, "missing_total": 0.15, "auth": 0.05}),  # v2 reads scans better
            (7, {"unreadable": 0.06, "missing_total": 0.03}),  # v3 asks for the total
        ],
    ),
    (
        "history-router",
        [("no_route", "No team owns the ticket's topic"), ("duplicate", "The ticket repeats an open one")],
        [
            (28, {"no_route": 0.08, "duplicate": 0.05}),
            (10, {"no_route": 0.35, "duplicate": 0.05}),  # v2 dropped a team from its list: a regression
        ],
    ),
]
HISTORY_RUNS_PER_DAY = (1, 3)


def history_task(outcome: str) -> dict[str, Any]:
    if outcome == "success":
        script: list[dict[str, Any]] = [{"text": "done"}]
    elif outcome == "auth":
        script = [{"http": 401}]
    else:
        script = [{"oz_fail": {"kind": outcome, "message": f"demo history: {outcome.replace('_', ' ')}"}}]
    return {"key": "work", "kind": "round", "model": "script", "prompt": "demo history: a past run", "script": script}


def drive_here(run: Run) -> None:
    """What a worker does, in this process: claim each ready call through the kernel, run it, report."""
    for _ in range(100):
        ready = list(Task.objects.filter(run=run, status="waiting", ready=True, kind__in=("tool", "round", "summarizer")))
        if not ready:
            return
        for task in ready:
            claimed = kernel.claim_task(run.pk, task.pk, f"demo-history:{task.pk}:{task.attempt}")
            if isinstance(claimed, kernel.Claimed):
                execute_claimed(claimed, threading.Event())


def load_history(workspace: Workspace, operator: User) -> int:
    """Four weeks of past runs of the history agents (once: skipped when any is there). Returns how many."""
    import time_machine  # the clock is moved only here

    if Run.objects.filter(workspace=workspace, input__demo=HISTORY_MARKER).exists():
        return 0
    picker = random.Random(15)  # the same history on every install
    today = timezone.now().astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    created = 0
    previous_sender = kernel.install_sender(lambda ids, chunks, run_id, sessions, priority=5: None)
    try:
        for name, kinds, versions in HISTORY:
            held: list[Run] = []  # an operator abandons a history hold the next day; the last day's stay open
            for index, (from_days_ago, odds) in enumerate(versions):
                until_days_ago = versions[index + 1][0] if index + 1 < len(versions) else 0
                for days_ago in range(from_days_ago, until_days_ago, -1):
                    day = today - timedelta(days=days_ago) + timedelta(hours=9)
                    with time_machine.travel(day, tick=True):
                        for run in held:
                            kernel.abandon(run_id=run.pk, key="work", user=operator)
                        held = []
                        if days_ago == from_days_ago:
                            register(history_manifest(name, index + 1, kinds), workspace=workspace)
                        for number in range(picker.randint(*HISTORY_RUNS_PER_DAY)):
                            roll, outcome = picker.random(), "success"
                            for kind, chance in odds.items():
                                if roll < chance:
                                    outcome = kind
                                    break
                                roll -= chance
                            body = {
                                "agent": name,
                                "tasks": [history_task(outcome)],
                                "deliverable": "work",
                                "input": {"demo": HISTORY_MARKER, "note": f"demo history: {day.date()} run {number + 1}"},
                            }
                            run, _ = kernel.create_run(workspace=workspace, user=operator, body=body)
                            drive_here(run)
                            run.refresh_from_db(fields=["status"])
                            if run.status == RunStatus.NEEDS_ATTENTION:
                                held.append(run)
                            created += 1
    finally:
        kernel.install_sender(previous_sender)
    return created


def demo_password(username: str) -> str:
    """Stable for an install (derived from SECRET_KEY), different between installs."""
    mac = hmac.new(settings.SECRET_KEY.encode(), f"oz0-demo:{username}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac)[:16].decode()


def ensure_users(workspace: Workspace) -> dict[str, User]:
    users: dict[str, User] = {}
    for role in ROLES:
        username = f"demo-{role}"
        password = demo_password(username)
        with transaction.atomic():
            user, created = User.objects.get_or_create(username=username)
            if created or not user.check_password(password):
                user.set_password(password)
                user.save(update_fields=["password"])
            Membership.objects.update_or_create(workspace=workspace, user=user, defaults={"role": role})
        users[role] = user
    return users


def load_agents(workspace: Workspace) -> dict[str, bool]:
    """Register oz0agents/examples/*.yaml as the workspace's agents through oz0agents.registry (a new version
    only when one changed).

    The harnessed examples are left out when the install turns their code off (OZ0_HARNESS_EXAMPLES=0).
    Returns each agent's name and whether it runs offline (on the `script` provider, or a harnessed
    example: each drives an offline model of its framework): only those get a demo run, since the
    others need a real model's credentials.
    """
    agents: dict[str, bool] = {}
    for path in sorted(AGENTS_DIR.glob("*.y*ml")):
        if not settings.OZ0_HARNESS_EXAMPLES and "harness" in (yaml.safe_load(path.read_text()) or {}):
            continue  # the example harnesses' code is off on this install (OZ0_HARNESS_EXAMPLES=0)
        try:
            registered = register(path.read_text(), workspace=workspace)
        except InvalidManifest as error:
            raise CommandError(f"{path.relative_to(settings.BASE_DIR)} does not lint: {error}") from None
        manifest = registered.version.manifest
        routes = [manifest.get("model", ""), *manifest.get("fallback_models", [])]
        offline = manifest.get("harness") is not None or all(str(route).split(":")[0] == "script" for route in routes)
        agents[registered.version.agent.name] = offline
    return agents


class Command(BaseCommand):
    help = "Load the demo workspace, its users and runs in every interesting state (idempotent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--quiet", action="store_true", help="print only the login details")

    def handle(self, *args: Any, **options: Any) -> None:
        workspace, _ = Workspace.objects.get_or_create(slug=WORKSPACE, defaults={"name": "Demo"})
        users = ensure_users(workspace)
        operator = users[Role.OPERATOR]
        agents = load_agents(workspace)
        history = load_history(workspace, operator)
        runs = [*DEMO_RUNS, *((f"agent:{name}", {"agent": name}) for name, offline in agents.items() if offline)]
        created = []
        for marker, body in runs:
            if Run.objects.filter(workspace=workspace, input__demo=marker).exists():
                continue
            request = {**body, "input": {"demo": marker, **(body.get("input") or {})}}
            run, _ = kernel.create_run(workspace=workspace, user=operator, body=request)
            created.append(f"{marker} ({run.id})")
        if not options["quiet"]:
            self.stdout.write(
                f"demo workspace {WORKSPACE!r}: "
                + (f"created {len(created)} run(s): {', '.join(created)}" if created else "runs already loaded")
            )
            self.stdout.write(
                f"history: {history} past run(s) of {', '.join(name for name, _, _ in HISTORY)}"
                if history
                else "history already loaded"
            )
            if not AGENTS_DIR.is_dir():
                self.stdout.write("no oz0agents/examples/ folder: no example agents loaded")
            elif agents:
                self.stdout.write(
                    "agents: "
                    + ", ".join(
                        name + ("" if offline else " (needs a model provider: no demo run)") for name, offline in agents.items()
                    )
                )
        self.stdout.write("log in as (user / password):")
        for role, user in users.items():
            self.stdout.write(f"  {user.username:<14} {demo_password(user.username)}   ({role})")
