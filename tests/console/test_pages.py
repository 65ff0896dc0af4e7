"""The console's pages through the Django client: roles, redaction, escaping, fragments, CSP."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from tests.conftest import Team
from tests.console import states

pytestmark = pytest.mark.django_db


def client_for(team: Team, role: str) -> Client:
    client = Client()
    client.force_login(team.users[role])
    return client


def test_it_signs_in_and_out(team: Team) -> None:
    client = Client()
    page = client.get("/login/")
    assert page.status_code == 200 and b"Sign in" in page.content
    user = team.users["operator"]
    response = client.post("/login/", {"username": user.username, "password": "pw-for-tests-only"})
    assert response.status_code == 302
    assert client.get("/").status_code == 302  # one workspace: straight to its inbox
    assert client.get("/logout/").status_code == 405
    assert client.post("/logout/").status_code == 302
    assert client.get(f"/w/{team.slug}/inbox/").status_code == 302


@pytest.mark.parametrize("path", ["/w/{slug}/inbox/", "/w/{slug}/holds/", "/w/{slug}/runs/"])
def test_it_redirects_the_anonymous_and_hides_from_outsiders(team: Team, path: str) -> None:
    url = path.format(slug=team.slug)
    anonymous = Client().get(url)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/login/")
    assert client_for(team, "outsider").get(url).status_code == 404
    assert client_for(team, "viewer").get(url).status_code == 200


def test_it_hides_a_run_from_outsiders(team: Team) -> None:
    run = states.halted_run(team.workspace, team.users["operator"])
    assert client_for(team, "outsider").get(f"/runs/{run.pk}/").status_code == 404
    assert Client().get(f"/runs/{run.pk}/").status_code == 302


@pytest.mark.spec("F11", "F12")
def test_it_shows_each_role_what_it_may_see_in_the_inbox(team: Team) -> None:
    states.approval_run(team.workspace, team.users["operator"], args={"path": "/etc/secret-words"})
    operator = client_for(team, "operator").get(f"/w/{team.slug}/inbox/").content.decode()
    reader = client_for(team, "reader").get(f"/w/{team.slug}/inbox/").content.decode()
    viewer = client_for(team, "viewer").get(f"/w/{team.slug}/inbox/").content.decode()
    for page in (operator, reader, viewer):
        assert "test.echo" in page and 'data-kind="approval"' in page
    assert "secret-words" in operator and "secret-words" in reader
    assert "secret-words" not in viewer and "hidden from your role" in viewer
    assert 'data-verb="approve"' in operator
    assert 'data-verb="approve"' not in reader and 'data-verb="approve"' not in viewer


@pytest.mark.spec("F11", "F12")
def test_it_shows_a_viewer_kinds_but_no_words_on_holds_and_the_run_page(team: Team) -> None:
    run = states.halted_run(team.workspace, team.users["operator"], detail="the secret detail")
    for url in (f"/w/{team.slug}/holds/", f"/runs/{run.pk}/"):
        viewer = client_for(team, "viewer").get(url).content.decode()
        operator = client_for(team, "operator").get(url).content.decode()
        assert "tool_failed" in viewer and "halt failure" in viewer
        assert "the secret detail" not in viewer
        assert "the secret detail" in operator
        assert 'data-verb="retry"' in operator and 'data-verb="abandon"' in operator
        assert 'data-verb="retry"' not in viewer and "data-verb=" not in viewer


def test_it_escapes_agent_words_and_disables_htmx_in_their_containers(team: Team) -> None:
    evil = '<img src=x onerror=alert(1)><div hx-get="/logout/" hx-trigger="load">'
    states.approval_run(team.workspace, team.users["operator"], args={"text": evil})
    page = client_for(team, "operator").get(f"/w/{team.slug}/inbox/").content.decode()
    assert "<img src=x" not in page and 'hx-get="/logout/"' not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert re.search(r'<pre class="args" hx-disable[^>]*>[^<]*&lt;img', page)


def test_it_sends_a_strict_csp_and_no_inline_script_or_style(team: Team) -> None:
    run = states.halted_run(team.workspace, team.users["operator"])
    for url in (f"/w/{team.slug}/inbox/", f"/w/{team.slug}/holds/", f"/w/{team.slug}/runs/", f"/runs/{run.pk}/", "/login/"):
        client = Client() if url == "/login/" else client_for(team, "operator")
        response = client.get(url)
        assert "script-src 'self'" in response["Content-Security-Policy"]
        html = response.content.decode()
        assert " style=" not in html and "<style" not in html
        for tag in re.findall(r"<script[^>]*>", html):
            assert 'src="/static/' in tag, tag
        assert 'hx-headers=\'{"X-CSRFToken": "' in html or url == "/login/"


def test_it_answers_htmx_with_the_fragment_the_page_includes(team: Team) -> None:
    run = states.halted_run(team.workspace, team.users["operator"])
    client = client_for(team, "operator")
    for url, marker in (
        (f"/w/{team.slug}/inbox/", 'data-kind="hold"'),
        (f"/w/{team.slug}/holds/", f'id="hold-{run.pk}"'),
        (f"/runs/{run.pk}/", 'class="run-head"'),
    ):
        page = client.get(url)
        fragment = client.get(url, HTTP_HX_REQUEST="true")
        assert b"<html" in page.content and b"<html" not in fragment.content
        assert marker in page.content.decode() and marker in fragment.content.decode()
        assert "HX-Request" in fragment["Vary"]


def test_it_filters_the_inbox_by_kind_and_agent(team: Team) -> None:
    states.agent("triage-bot", team.workspace)
    states.approval_run(team.workspace, team.users["operator"], agent_name="triage-bot")
    states.question_run(team.workspace, team.users["operator"], question="Which region should I use?")
    states.halted_run(team.workspace, team.users["operator"])
    client = client_for(team, "operator")
    every = client.get(f"/w/{team.slug}/inbox/").content.decode()
    assert every.count('class="card item ') == 3
    questions = client.get(f"/w/{team.slug}/inbox/?kind=question").content.decode()
    assert 'data-kind="question"' in questions and 'data-kind="approval"' not in questions
    assert "Which region should I use?" in questions and 'data-verb="answer"' in questions
    of_agent = client.get(f"/w/{team.slug}/inbox/?agent=triage-bot").content.decode()
    assert of_agent.count('class="card item ') == 1 and "triage-bot" in of_agent


def test_it_pages_the_inbox_with_load_more(team: Team) -> None:
    for _ in range(27):
        states.approval_run(team.workspace, team.users["operator"])
    client = client_for(team, "operator")
    first = client.get(f"/w/{team.slug}/inbox/").content.decode()
    assert first.count('class="card item ') == 25
    cursor = re.search(r"cursor=([^\"&]+)", first)
    assert cursor is not None
    rest = client.get(f"/w/{team.slug}/inbox/?cursor={cursor.group(1)}", HTTP_HX_REQUEST="true").content.decode()
    assert rest.count('class="card item ') == 2 and "Load more" not in rest
    assert 'class="toolbar"' not in rest
    ids_first = set(re.findall(r'id="item-(task_3a_\d+)"', first))
    ids_rest = set(re.findall(r'id="item-(task_3a_\d+)"', rest))
    assert not ids_first & ids_rest


def test_it_lists_runs_with_status_filters(team: Team) -> None:
    held = states.halted_run(team.workspace, team.users["operator"])
    waiting = states.approval_run(team.workspace, team.users["operator"])
    client = client_for(team, "viewer")
    every = client.get(f"/w/{team.slug}/runs/").content.decode()
    assert f'id="run-{held.pk}"' in every and f'id="run-{waiting.pk}"' in every
    only_held = client.get(f"/w/{team.slug}/runs/?status=needs_attention").content.decode()
    assert f'id="run-{held.pk}"' in only_held and f'id="run-{waiting.pk}"' not in only_held


def test_it_draws_the_task_graph_by_depth(team: Team) -> None:
    from runs import kernel

    long_key = "a-very-long-task-key-that-would-overflow-its-box"
    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={
            "tasks": [
                {"key": long_key, "kind": "tool", "tool": "test.echo", "args": {"value": 1}, "after": []},
                {"key": "b", "kind": "tool", "tool": "test.echo", "args": {"value": 2}, "after": [long_key]},
                {"key": "c", "kind": "tool", "tool": "test.echo", "args": {"value": 3}, "after": []},
            ],
            "deliverable": "b",
        },
    )
    page = client_for(team, "reader").get(f"/runs/{run.pk}/").content.decode()
    svg = page[page.index('<svg class="graph"') : page.index("</svg>")]
    assert svg.count('<g class="node') == 3 and svg.count('class="edge') == 1
    assert f"<title>{long_key} · tool · " in svg and ">a-very-long-task-…</text>" in svg
    xs = dict(re.findall(r'data-key="([^"]+)"[^>]*>\s*<title>[^<]*</title>\s*<rect x="(\d+)"', svg))
    assert int(xs["b"]) > int(xs[long_key]) == int(xs["c"])


def test_it_escapes_keys_in_the_graph() -> None:
    from django.template.loader import render_to_string

    tasks = [
        {"key": "<b>x</b>", "kind": "tool", "status": "failed", "after": []},
        {"key": "y", "kind": "tool", "status": "waiting", "after": ["<b>x</b>"]},
    ]
    svg = render_to_string("runs/_graph.html", {"doc": {"graph": {"nodes": tasks, "hidden": 0}, "status_counts": []}})
    assert "<b>x</b>" not in svg and "&lt;b&gt;x&lt;/b&gt;" in svg
    assert 'class="node status-failed"' in svg


def test_it_keeps_live_refreshes_from_queueing_behind_the_verbs(team: Team) -> None:
    """hx-sync is inherited: a live container's "queue last" would let a refresh drop a
    queued click on a button inside it, so every live container disinherits it."""
    run = states.halted_run(team.workspace, team.users["operator"])
    client = client_for(team, "operator")
    for url in (f"/w/{team.slug}/inbox/", f"/w/{team.slug}/holds/", f"/w/{team.slug}/runs/", f"/runs/{run.pk}/"):
        html = client.get(url).content.decode()
        live = re.findall(r"<[^>]*hx-trigger=\"oz0:changed from:body\"[^>]*>", html)
        assert len(live) == 1, url
        assert re.search(r"hx-disinherit=\"[^\"]*\bhx-sync\b", live[0]), live[0]
        assert "<time datetime=" in html, url  # relative times tick in the browser


def test_it_pages_runs_and_refreshes_the_table_with_its_count(team: Team) -> None:
    from runs import kernel

    for index in range(52):
        kernel.create_run(
            workspace=team.workspace,
            user=team.users["operator"],
            body={"tasks": [{"key": "a", "kind": "tool", "tool": "test.echo", "args": {"value": index}, "after": []}]},
        )
    client = client_for(team, "viewer")
    page = client.get(f"/w/{team.slug}/runs/").content.decode()
    assert page.count('<tr id="run-') == 50 and '<span data-count="runs">52</span>' in page
    cursor = re.search(r"cursor=([^\"&]+)", page)
    assert cursor is not None
    rest = client.get(f"/w/{team.slug}/runs/?cursor={cursor.group(1)}", HTTP_HX_REQUEST="true").content.decode()
    assert rest.count('<tr id="run-') == 2 and "<table" not in rest and "Load more" not in rest
    live = client.get(f"/w/{team.slug}/runs/", HTTP_HX_REQUEST="true").content.decode()
    assert "<table" in live and '<span data-count="runs">52</span>' in live and "<html" not in live
