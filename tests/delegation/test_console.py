"""The run page shows a run's children (status, kind) and links both ways; a viewer sees kinds,
never a child's words, and an outsider sees nothing (F11, F12, F14)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tests.conftest import Team
from tests.delegation.tree import agent, child_of, create, drive_tree

pytestmark = pytest.mark.usefixtures("no_dispatch")

WORDS = "the private reason the child gave up"


def page(team: Team, role: str, path: str) -> tuple[int, str]:
    client = Client()
    client.force_login(team.users[role])
    response = client.get(path)
    return response.status_code, response.content.decode()


@pytest.mark.spec("F12", "F14")
def test_the_run_page_links_parent_and_children_and_keeps_the_childs_words_from_a_viewer(
    team: Team, django_capture_on_commit_callbacks: Any
) -> None:
    helper = agent(
        team.workspace,
        "model: script\ntools: [oz.fail]\nfailures:\n  - kind: gave_up\n    description: Gave up\n"
        f"approval: {{mode: bypass}}\nscript:\n  - oz_fail: {{kind: gave_up, message: {WORDS!r}}}\n",
    )
    parent = create(
        team.workspace, team.users["operator"], tasks=[{"key": "d", "kind": "delegate", "agent": helper, "on_failure": "halt"}]
    )
    parent = drive_tree(parent, django_capture_on_commit_callbacks)
    child = child_of(parent, "d")
    for role in ("viewer", "reader", "operator"):
        status, body = page(team, role, f"/runs/{parent.pk}/")
        assert status == 200
        assert 'id="run-family"' in body and f'href="/runs/{child.pk}/"' in body
        assert "gave_up" in body
        assert 'data-key="d" data-status="failed" data-child-status="canceled"' in body  # the graph's delegate node
        if role == "viewer":
            assert WORDS not in body
        status, body = page(team, role, f"/runs/{child.pk}/")
        assert status == 200 and f'href="/runs/{parent.pk}/"' in body
        assert (WORDS in body) is (role != "viewer")
    for path in (f"/runs/{parent.pk}/", f"/runs/{child.pk}/"):
        assert page(team, "outsider", path)[0] == 404


@pytest.mark.spec("F14", "S19")
def test_a_held_child_shows_on_its_parents_page_and_in_the_inbox(team: Team, django_capture_on_commit_callbacks: Any) -> None:
    stuck = agent(
        team.workspace,
        "model: script\ntools: [{name: test.fail, on_failure: halt}]\napproval: {mode: bypass}\nscript:\n"
        "  - tool_calls: [{tool: test.fail, args: {error: tool_failed, detail: broke}}]\n  - text: never\n",
    )
    parent = create(team.workspace, team.users["operator"], tasks=[{"key": "d", "kind": "delegate", "agent": stuck}])
    parent = drive_tree(parent, django_capture_on_commit_callbacks)
    child = child_of(parent, "d")
    assert (parent.status, child.status) == ("running", "needs_attention")
    status, body = page(team, "viewer", f"/runs/{parent.pk}/")
    assert status == 200 and "the parent waits on it" in body and f'href="/runs/{child.pk}/"' in body
    status, inbox = team.api("viewer").get(f"/inbox?workspace={team.slug}&kind=hold")
    assert status == 200
    [item] = [i for i in inbox["items"] if i["run"] == str(child.pk)]
    assert item["parent"] == str(parent.pk) and item["kinds"] == ["tool_failed"]
    status, body = page(team, "operator", f"/w/{team.slug}/inbox/")
    assert status == 200 and f'href="/runs/{parent.pk}/"' in body
