"""Issue 30.6: a client's await shows its question, read-only, on the run page (before, the task
only read `dispatched`): content readers see the words, a viewer reads that they are hidden, and
nobody gets an answer form (its client answers it with the token the run gave it)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from runs import kernel
from runs.models import Task
from tests.conftest import Team


def page(team: Team, role: str, run: Any) -> str:
    client = Client()
    client.force_login(team.users[role])
    response = client.get(f"/runs/{run.pk}/")
    assert response.status_code == 200
    return response.content.decode()


@pytest.mark.django_db
@pytest.mark.parametrize("role", ["operator", "reader", "viewer"])
def test_the_run_page_shows_a_client_awaits_question_read_only(team: Team, no_dispatch: list[int], role: str) -> None:
    body = {"tasks": [{"key": "confirm", "kind": "await", "question": "Ship the <b>release</b>?"}]}
    run, _ = kernel.create_run(workspace=team.workspace, user=team.users["operator"], body=body)
    assert Task.objects.get(run=run, key="confirm").status == "dispatched"
    html = page(team, role, run)
    assert 'data-kind="client_await"' in html and "A client asks" in html and "client-await-note" in html
    if role == "viewer":
        assert "Ship the" not in html and "The question is hidden from your role." in html
    else:
        assert "Ship the &lt;b&gt;release&lt;/b&gt;?" in html  # escaped, never markup
    assert 'data-verb="answer"' not in html  # read-only: no answer form for anyone


@pytest.mark.django_db
def test_an_outsider_sees_no_client_await(team: Team, no_dispatch: list[int]) -> None:
    body = {"tasks": [{"key": "confirm", "kind": "await", "question": "secret?"}]}
    run, _ = kernel.create_run(workspace=team.workspace, user=team.users["operator"], body=body)
    client = Client()
    client.force_login(team.users["outsider"])
    assert client.get(f"/runs/{run.pk}/").status_code == 404


# ---- in the inbox too (issue 30.6) ----


def client_await_run(team: Team, question: str = "Ship the <b>release</b>?", **body: Any) -> Any:
    run, receipt = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={"tasks": [{"key": "confirm", "kind": "await", "question": question}], **body},
    )
    assert Task.objects.get(run=run, key="confirm").status == "dispatched"
    return run, receipt["tokens"]["confirm"]


def inbox_page(team: Team, role: str, query: str = "") -> str:
    client = Client()
    client.force_login(team.users[role])
    response = client.get(f"/w/{team.slug}/inbox/{query}")
    assert response.status_code == 200
    return response.content.decode()


@pytest.mark.django_db
@pytest.mark.spec("S8", "F11")
@pytest.mark.parametrize("role", ["operator", "reader", "viewer"])
def test_the_inbox_shows_a_client_awaits_question_read_only(team: Team, no_dispatch: list[int], role: str) -> None:
    run, _ = client_await_run(team)
    for query in ("", "?kind=client_await"):
        html = inbox_page(team, role, query)
        assert f'data-run="{run.pk}"' in html and 'data-kind="client_await"' in html and "A client asks" in html
        assert "client-await-note" in html and 'data-verb="answer"' not in html
        if role == "viewer":
            assert "Ship the" not in html and "The question is hidden from your role." in html
        else:
            assert "Ship the &lt;b&gt;release&lt;/b&gt;?" in html
    assert '<span class="count" data-count="client_await">1</span>' in inbox_page(team, role)
    # Not what the approvals or questions tabs list.
    assert f'data-run="{run.pk}"' not in inbox_page(team, role, "?kind=question")


@pytest.mark.django_db
@pytest.mark.spec("S8", "S20")
def test_a_client_await_counts_in_the_tab_but_not_in_the_title_which_counts_what_waits_on_a_person(
    team: Team, no_dispatch: list[int]
) -> None:
    client_await_run(team)
    html = inbox_page(team, "operator")
    assert 'data-pending="0" data-count="all">1</span>' in html
    assert "<title>Inbox" in html  # no "(1)": nothing waits on this person


@pytest.mark.django_db
@pytest.mark.spec("S8", "F11", "F12")
def test_the_inbox_api_lists_a_client_await_read_only_with_its_question_for_readers(team: Team, no_dispatch: list[int]) -> None:
    run, token = client_await_run(team, question="Deploy?")
    for role, words in (("operator", True), ("reader", True), ("viewer", False)):
        status, page = team.api(role).get(f"/inbox?workspace={team.slug}&kind=client_await")
        assert status == 200, page
        [item] = page["items"]
        assert (item["kind"], item["run"], item["task"], item["actionable"]) == ("client_await", str(run.pk), "confirm", False)
        assert ("question" in item and item["question"] == "Deploy?") is words
        assert item["content_visible"] is words
    status, everything = team.api().get(f"/inbox?workspace={team.slug}")
    assert [i["kind"] for i in everything["items"]] == ["client_await"]
    assert team.api("outsider").get(f"/inbox?workspace={team.slug}")[1]["items"] == []
    # Resolved with its token, it is gone.
    assert team.api().post("/awaits", {"token": token, "value": "yes"})[0] == 200
    assert team.api().get(f"/inbox?workspace={team.slug}&kind=client_await")[1]["items"] == []


@pytest.mark.django_db
@pytest.mark.spec("F11", "F12")
def test_someone_elses_private_client_await_shows_no_words(team: Team, no_dispatch: list[int]) -> None:
    from tests.factories import make_member

    run, _ = client_await_run(team, question="private words?", private=True)
    other = make_member(workspace=team.workspace, role="operator")
    client = Client()
    client.force_login(other)
    html = client.get(f"/w/{team.slug}/inbox/?kind=client_await").content.decode()
    assert f'data-run="{run.pk}"' in html and "private words" not in html
    # Told apart from a role that reads no words (issue 30.8): whose private run it is.
    assert f"The question is hidden: this is a private run of {team.users['operator'].username}" in html


@pytest.mark.django_db
def test_client_awaits_page_in_wait_order(team: Team, no_dispatch: list[int]) -> None:
    first, _ = client_await_run(team, question="one?")
    second, _ = client_await_run(team, question="two?")
    api = team.api()
    status, page = api.get(f"/inbox?workspace={team.slug}&limit=1")
    assert status == 200 and [i["run"] for i in page["items"]] == [str(first.pk)] and page["next"]
    status, rest = api.get(f"/inbox?workspace={team.slug}&limit=1&cursor={page['next']}")
    assert [i["run"] for i in rest["items"]] == [str(second.pk)] and rest["next"] is None
    assert api.get("/inbox?kind=nope")[0] == 400
