"""Plant secrets in every place a run keeps words, and walk every URL the project serves.

`plant(team, private=...)` creates runs (through the API, driven in-process by the
kernel and the script provider) whose failure message, tool args, tool error
detail, prompt, question, await answer, deny reason and cancel reason are unique
secrets. `concrete_urls()` turns every URL pattern of the project (the JSON API and
the console) into concrete URLs for the planted runs, tasks and workspace.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.urls import URLPattern, URLResolver, get_resolver

from oz0agents.lint import lint
from oz0agents.models import Agent, AgentVersion
from runs.models import Run, Task
from tests.runs.driver import drive

SKIP_PREFIXES = ("admin/", "logout/", "static/", "login/")
PARAM = re.compile(r"<(?:(?P<converter>[^>:]+):)?(?P<name>[^>]+)>")


@dataclass
class Planted:
    runs: list[Run] = field(default_factory=list)
    secrets: dict[str, str] = field(default_factory=dict)  # what → secret
    agent: str = ""

    def secret(self, what: str, tag: str) -> str:
        value = f"SECRET{uuid.uuid4().hex[:12].upper()}{tag}{what.upper().replace('_', '')}"
        self.secrets[what] = value
        return value


def make_agent(name: str, *, workspace: Any, versions: int = 1, kinds: tuple[str, ...] = ("not_found",)) -> Agent:
    """The workspace's agent with `versions` versions declaring `kinds`, its manifest normalized as registration does."""
    agent = Agent.objects.create(name=name, workspace=workspace)
    failures = "".join(
        f"  - kind: {kind}\n    description: {kind} happened\n" + ("    person: true\n" if kind == "not_found" else "")
        for kind in kinds
    )
    for version in range(1, versions + 1):
        text = f"name: {name}\nmodel: script\ntools: [oz.fail, test.echo]\nfailures:\n{failures}instructions: version {version}\n"
        linted = lint(text)
        assert linted.ok and linted.manifest is not None, linted.errors
        AgentVersion.objects.create(
            agent=agent, version=version, manifest_text=text, manifest=linted.manifest, digest=f"{name}{version}"
        )
    return agent


def plant(team: Any, *, private: bool, tag: str) -> Planted:
    """Runs created by the team's operator whose every word is a secret (F11, F12)."""
    planted = Planted(agent=f"secretive-{uuid.uuid4().hex[:8]}")
    make_agent(planted.agent, workspace=team.workspace)
    api = team.api("operator")

    def create(body: dict[str, Any]) -> Run:
        status, doc = api.post(f"/workspaces/{team.slug}/runs", {**body, "private": private})
        assert status == 201, doc
        run = Run.objects.get(pk=doc["run"]["id"])
        planted.runs.append(run)
        return run

    # oz.fail: the agent's own message, and the prompt that led to it.
    failing = create(
        {
            "agent": planted.agent,
            "tasks": [
                {
                    "key": "r1",
                    "kind": "round",
                    "model": "script",
                    "prompt": planted.secret("prompt", tag),
                    "script": [{"oz_fail": {"kind": "not_found", "message": planted.secret("failure_message", tag)}}],
                }
            ],
            "deliverable": "r1",
        }
    )
    drive(failing)
    # Kept as a regression case: the case copies its words (the script's message), shown by the run's rule.
    status, kept = api.post(f"/runs/{failing.pk}/regression-case")
    assert status == 201, kept

    # A tool whose args and error detail are words; it halts the run (a hold).
    held = create(
        {
            "agent": planted.agent,
            "tasks": [
                {
                    "key": "t1",
                    "kind": "tool",
                    "tool": "test.fail",
                    "args": {
                        "error": "tool_failed",
                        "detail": planted.secret("tool_error", tag),
                        "note": planted.secret("tool_args", tag),
                    },
                    "on_failure": "halt",
                }
            ],
            "deliverable": "t1",
        }
    )
    drive(held)

    # Two model-composed calls under `ask`: one denied with a reason, one left waiting (the inbox).
    approvals = create(
        {
            "agent": planted.agent,
            "approval": {"mode": "ask"},
            "tasks": [
                {
                    "key": "r1",
                    "kind": "round",
                    "model": "script",
                    "prompt": "go",
                    "tools": ["test.echo"],
                    "script": [
                        {
                            "tool_calls": [
                                {"tool": "test.echo", "args": {"value": planted.secret("composed_args", tag)}},
                                {"tool": "test.echo", "args": {"value": planted.secret("pending_args", tag)}},
                            ]
                        },
                        {"text": "done"},
                    ],
                }
            ],
            "deliverable": "r1",
        }
    )
    drive(approvals)
    status, doc = api.post(f"/runs/{approvals.pk}/tasks/r1.1/deny", {"reason": planted.secret("deny_reason", tag)})
    assert status == 200, doc

    # A model's question (the inbox) and a client await answered with words, then a reasoned cancel.
    asking = create(
        {
            "agent": planted.agent,
            "tasks": [
                {"key": "ask", "kind": "await", "question": planted.secret("question", tag)},
                {
                    "key": "r1",
                    "kind": "round",
                    "model": "script",
                    "prompt": "go",
                    "script": [{"ask": planted.secret("model_question", tag)}],
                },
            ],
        }
    )
    status, doc = api.post(
        f"/workspaces/{team.slug}/runs", {"tasks": [{"key": "a", "kind": "await", "question": "q"}], "private": private}
    )
    assert status == 201, doc
    answered = Run.objects.get(pk=doc["run"]["id"])
    planted.runs.append(answered)
    token = doc["receipt"]["tokens"]["a"]
    status, doc = api.post(f"/awaits/{token}", {"value": planted.secret("await_answer", tag)})
    assert status == 200, doc
    drive(asking)
    status, doc = api.post(f"/runs/{asking.pk}/cancel", {"reason": planted.secret("cancel_reason", tag)})
    assert status == 200, doc

    # A classifier refusal switches to the fallback: its category is the classifier's reading of the words.
    refused = create(
        {
            "tasks": [
                {
                    "key": "r1",
                    "kind": "round",
                    "model": "script:main",
                    "prompt": "go",
                    "fallback_models": ["script:backup"],
                    "script": {
                        "script:main": [{"refusal": "classifier", "category": planted.secret("refusal_category", tag)}],
                        "script:backup": [{"text": "answered"}],
                    },
                }
            ],
            "deliverable": "r1",
        }
    )
    drive(refused)

    for run in planted.runs:
        run.refresh_from_db()
    return planted


def _routes(patterns: list[Any], prefix: str = "") -> list[str]:
    routes: list[str] = []
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            routes.extend(_routes(pattern.url_patterns, route))
        elif isinstance(pattern, URLPattern):
            routes.append(route)
    return routes


def url_routes() -> list[str]:
    """Every route of the project, as `a/<conv:name>/b` strings, minus admin, login and logout."""
    routes = []
    for route in _routes(get_resolver().url_patterns):
        if route.startswith("^") or route.startswith(SKIP_PREFIXES):
            continue
        routes.append(route)
    return sorted(set(routes))


def concrete_urls(route: str, *, runs: list[Run], slug: str, agent: str) -> list[str]:
    """The route filled in for each planted run (and each of its task keys), the workspace and the agent."""
    names = [m.group("name") for m in PARAM.finditer(route)]
    run_names = [n for n in names if "run" in n or n in ("id", "pk", "job")]
    key_names = [n for n in names if n in ("key", "task", "task_key")]

    def fill(values: dict[str, str]) -> str:
        def one(match: re.Match[str]) -> str:
            name = match.group("name")
            if name in values:
                return values[name]
            if name in ("ws", "slug", "workspace"):
                return slug
            if name in ("agent", "name"):
                return agent
            return "1"

        return "/" + PARAM.sub(one, route)

    if "group_id" in names:
        # The failure groups of the planted runs (their pages show a shape to who may read it). The
        # name is a failure group's alone: an approver group is `approver_group_id`, which holds no
        # run's words and is filled like any other id.
        from insights.models import FailureGroup
        from runs.models import Finding

        prints = Finding.objects.filter(run_id__in=[r.pk for r in runs]).values("fingerprint")
        ids = FailureGroup.objects.filter(fingerprint__in=prints).values_list("pk", flat=True)
        routes = [PARAM.sub(lambda m, pk=pk: str(pk) if m.group("name") == "group_id" else m.group(0), route) for pk in ids]
        return [u for filled in routes for u in concrete_urls(filled, runs=runs, slug=slug, agent=agent)]
    if "verb" in names:
        return [u for verb in VERBS for u in concrete_urls(route.replace("<str:verb>", verb), runs=runs, slug=slug, agent=agent)]
    if not run_names:
        return [fill({})]
    urls = []
    for run in runs:
        base = {n: str(run.pk) for n in run_names}
        if key_names:
            for key in Task.objects.filter(run=run).values_list("key", flat=True):
                urls.append(fill({**base, **dict.fromkeys(key_names, key)}))
        else:
            urls.append(fill(base))
    return urls


VERBS = ("retry", "abandon", "compact", "approve", "deny", "answer", "cancel", "pause", "resume", "append")

QUERIES = {
    "/api/v1/inbox": ["", "?kind=approval", "?kind=question", "?kind=hold"],
    "/api/v1/findings": ["", "?q=finding:failure_not_found"],
}


def with_queries(url: str, slug: str) -> list[str]:
    if url.endswith("/wait"):
        return [url + "?after=0&timeout=0"]
    extra = QUERIES.get(url, [""])
    out = [url + q for q in extra]
    if url in ("/api/v1/inbox", "/inbox", "/inbox/"):
        out.append(url + f"?workspace={slug}")
    return out
