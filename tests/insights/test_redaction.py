"""F11, F12: a reader the content is closed to finds no word of a run on any surface.

Secrets are planted in a failure message, a prompt, tool args, a tool's error detail,
questions, an await's answer, a deny reason and a cancel reason; then every URL the
project serves (the JSON API and the console, listed from the URL resolver) is
fetched as a viewer, as a reader of someone else's private run and as an outsider,
and each response is grepped for every secret. The operator who created the runs
must find each secret somewhere, so the walk proves the secrets were reachable.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from oz0site import realtime
from runs.failures import PLATFORM_TEXTS, fixed_sentence
from runs.models import Run
from tests.insights.planting import Planted, concrete_urls, plant, url_routes, with_queries

pytestmark = pytest.mark.django_db


def clients(team: Any, role: str) -> tuple[Client, Client]:
    api = Client(HTTP_AUTHORIZATION=f"Bearer {team.tokens[role]}", raise_request_exception=False)
    console = Client(raise_request_exception=False)
    console.force_login(team.users[role])
    return api, console


def walk(team: Any, role: str, planted: list[Planted], *, write: bool) -> tuple[dict[str, str], list[str]]:
    """Every URL as `role`: GET always, POST too when `write` (closed readers must be refused)."""
    api, console = clients(team, role)
    runs = [run for p in planted for run in p.runs]
    bodies: dict[str, str] = {}
    errors: list[str] = []
    for route in url_routes():
        for url in concrete_urls(route, runs=runs, slug=team.slug, agent=planted[0].agent):
            client = api if url.startswith("/api/") else console
            for full in with_queries(url, team.slug):
                methods = ("get", "post") if write else ("get",)
                for method in methods:
                    if method == "post" and url.startswith("/api/"):
                        response = client.post(full, json.dumps({"reason": "x", "value": "x"}), content_type="application/json")
                    elif method == "post":
                        response = client.post(full, {"reason": "x", "value": "x"})
                    else:
                        response = client.get(full)
                    if response.status_code >= 500:
                        errors.append(f"{method.upper()} {full} -> {response.status_code}")
                    if not getattr(response, "streaming", False):
                        bodies[f"{method.upper()} {full}"] = response.content.decode(errors="replace")
    return bodies, errors


def leaks(bodies: dict[str, str], secrets: dict[str, str]) -> list[str]:
    return [f"{what} at {where}" for where, body in bodies.items() for what, secret in secrets.items() if secret in body]


@pytest.fixture
def planted(team: Any, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any) -> dict[str, Any]:
    pushes: list[dict[str, Any]] = []
    monkeypatch.setattr(realtime, "publish", lambda groups, payload: pushes.append(payload))
    # The kernel sends nowhere here (tests/insights/conftest.py installs a sender that drops them).
    with django_capture_on_commit_callbacks(execute=True):
        public = plant(team, private=False, tag="PUB")
        private = plant(team, private=True, tag="PRIV")
    return {"public": public, "private": private, "pushes": pushes}


@pytest.mark.spec("F11", "F12")
def test_it_plants_every_secret_where_the_creator_can_read_it(team: Any, planted: dict[str, Any]) -> None:
    bodies, errors = walk(team, "operator", [planted["public"], planted["private"]], write=False)
    secrets = {**planted["public"].secrets, **{f"private {k}": v for k, v in planted["private"].secrets.items()}}
    found = {what for what, secret in secrets.items() if any(secret in body for body in bodies.values())}
    # The words every reader with content permission must be able to read somewhere (the run
    # document, the trace, the inbox). Prompts, tool args and client questions may show on no
    # surface at all; the closed-reader walks still prove they never leak where they do show.
    shown = {
        "failure_message",
        "tool_error",
        "deny_reason",
        "await_answer",
        "cancel_reason",
        "pending_args",
        "model_question",
        "refusal_category",
    }
    assert shown | {f"private {w}" for w in shown} <= found
    assert errors == []


@pytest.mark.thorough
@pytest.mark.spec("F11", "F12")
@pytest.mark.parametrize("role", ["viewer", "outsider"])
def test_it_shows_a_viewer_and_an_outsider_no_words_anywhere(team: Any, planted: dict[str, Any], role: str) -> None:
    bodies, errors = walk(team, role, [planted["public"], planted["private"]], write=True)
    secrets = {**planted["public"].secrets, **{f"private {k}": v for k, v in planted["private"].secrets.items()}}
    assert len(bodies) > 100
    assert leaks(bodies, secrets) == []
    assert errors == []


@pytest.mark.thorough
@pytest.mark.spec("F11", "F12")
def test_it_shows_a_reader_no_words_of_someone_elses_private_run(team: Any, planted: dict[str, Any]) -> None:
    bodies, errors = walk(team, "reader", [planted["public"], planted["private"]], write=True)
    assert leaks(bodies, planted["private"].secrets) == []
    # The same reader reads the public runs' words: the rule is about content, not the role alone.
    found = {what for what, secret in planted["public"].secrets.items() if any(secret in body for body in bodies.values())}
    assert {"failure_message", "tool_error", "deny_reason", "await_answer", "cancel_reason", "pending_args"} <= found
    assert errors == []


@pytest.mark.spec("F12")
def test_it_pushes_statuses_and_keys_never_words(planted: dict[str, Any]) -> None:
    pushes = planted["pushes"]
    assert pushes, "the kernel published nothing"
    text = json.dumps(pushes)
    secrets = {**planted["public"].secrets, **planted["private"].secrets}
    assert [what for what, secret in secrets.items() if secret in text] == []
    assert {key for push in pushes for key in push} <= {"type", "run", "workspace", "status", "seq", "attention", "tasks"}


@pytest.mark.spec("F1", "F10", "F11")
def test_it_gives_a_closed_reader_kind_flags_and_a_fixed_sentence(team: Any, planted: dict[str, Any]) -> None:
    failing = planted["private"].runs[0]
    status, doc = team.api("reader").get(f"/runs/{failing.pk}")
    assert status == 200
    assert doc["failure"] == {
        "kind": "not_found",
        "retryable": False,
        "partial": False,
        "person": True,
        "message": None,
        "declared": True,
    }
    assert doc["error"] == fixed_sentence("not_found")
    status, doc = team.api("operator").get(f"/runs/{failing.pk}")
    assert doc["failure"]["message"] == planted["private"].secrets["failure_message"]
    assert doc["error"] == planted["private"].secrets["failure_message"]


@pytest.mark.spec("F11")
def test_it_keeps_the_platforms_own_cancel_text_for_everyone(team: Any, planted: dict[str, Any]) -> None:
    canceled = Run.objects.get(pk=planted["public"].runs[3].pk)
    assert canceled.status == "canceled"
    status, doc = team.api("viewer").get(f"/runs/{canceled.pk}")
    assert doc["error"] == "canceled" and "canceled" in PLATFORM_TEXTS
    assert doc["failure"]["kind"] == "cancelled" and doc["failure"]["message"] is None


@pytest.mark.thorough
@pytest.mark.spec("F11", "F12")
def test_it_shows_a_reader_behind_a_wall_no_words_of_the_walled_agents_runs_anywhere(team: Any, planted: dict[str, Any]) -> None:
    """Walls (issue 31 item 6): the third reason words are closed, on every URL as the others."""
    from tenancy.models import Wall

    public = planted["public"]
    Run.objects.filter(pk__in=[run.pk for run in public.runs]).update(agent_name=public.agent)
    bodies, errors = walk(team, "reader", [public], write=False)
    found = {what for what, secret in public.secrets.items() if any(secret in body for body in bodies.values())}
    assert {"failure_message", "pending_args"} <= found  # before the wall the reader reads them
    wall = Wall.objects.create(workspace=team.workspace, agent_name=public.agent)
    wall.members.add(team.users["reader"])
    bodies, errors = walk(team, "reader", [public], write=True)
    assert leaks(bodies, public.secrets) == []
    assert errors == []
