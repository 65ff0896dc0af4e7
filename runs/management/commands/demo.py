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

When `agents/` holds manifests, they are registered as the demo workspace's agents and each
that runs offline gets one run.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from runs import kernel
from runs.models import Membership, Role, Run, Workspace

WORKSPACE = "demo"
ROLES = (Role.OPERATOR, Role.READER, Role.VIEWER)
AGENTS_DIR = Path(settings.BASE_DIR) / "agents"

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
                    "script": [{"oz_fail": {"kind": "no_such_issue", "message": "issue 404 does not exist"}}],
                }
            ],
            "approval": {"mode": "bypass"},
        },
    ),
]


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
    """Register agents/*.yaml as the workspace's agents through runs.manifests (a new version
    only when one changed).

    Returns each agent's name and whether it runs offline (on the `script` provider): only
    those get a demo run, since the others need a real model's credentials.
    """
    try:
        from runs import manifests
    except ImportError:
        return {}
    agents: dict[str, bool] = {}
    for path in sorted(AGENTS_DIR.glob("*.y*ml")):
        try:
            registered = manifests.register(path.read_text(), workspace=workspace)
        except manifests.InvalidManifest as error:
            raise CommandError(f"{path.relative_to(settings.BASE_DIR)} does not lint: {error}") from None
        manifest = registered.version.manifest
        routes = [manifest.get("model", ""), *manifest.get("fallback_models", [])]
        agents[registered.version.agent.name] = all(str(route).split(":")[0] == "script" for route in routes)
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
            if not AGENTS_DIR.is_dir():
                self.stdout.write("no agents/ folder: no example agents loaded")
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
