"""Deciding a call needs to read it (S5, S6, F11): approving, denying or answering a private run's
waiting task takes content standing (its creator, or whoever may read its words), not only the
operator role. Anyone else gets 403 `content_hidden` in the API and the console, and the inbox and
the run page show such an item as not actionable (no args, no digest, no buttons)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from runs import kernel
from runs.models import Run, Task
from tests.conftest import Api, Team
from tests.console import states
from tests.factories import make_member, make_token

pytestmark = pytest.mark.django_db


@pytest.fixture
def colleague(team: Team) -> Any:
    """Another operator of the workspace, who did not create the private runs."""
    return make_member(workspace=team.workspace, role="operator")


def private_approval(team: Team) -> Run:
    return states.approval_run(team.workspace, team.users["operator"], private=True, args={"path": "/etc/secret"})


def private_question(team: Team) -> Run:
    run = states.question_run(team.workspace, team.users["operator"])
    Run.objects.filter(pk=run.pk).update(private=True)
    return Run.objects.get(pk=run.pk)


DECISIONS = [
    ("approve", private_approval, {}, "waiting"),
    ("deny", private_approval, {"reason": "no"}, "failed"),
    ("answer", private_question, {"value": "eu-west"}, "completed"),
]


@pytest.mark.spec("S5", "S6", "F11")
@pytest.mark.parametrize(("verb", "make", "body", "after"), DECISIONS, ids=[d[0] for d in DECISIONS])
def test_the_api_refuses_a_decision_to_whoever_cannot_read_the_call(
    team: Team, colleague: Any, verb: str, make: Any, body: dict[str, Any], after: str
) -> None:
    run = make(team)
    path = f"/runs/{run.pk}/tasks/r1.1/{verb}"
    expected = {"outsider": (404, "not_found"), "viewer": (403, "forbidden"), "reader": (403, "forbidden")}
    for role, (status, key) in expected.items():
        got, answer = team.api(role).post(path, body)
        assert (got, answer["error"]["key"]) == (status, key), (role, answer)
    status, answer = Api(make_token(user=colleague)).post(path, body)
    assert status == 403 and answer["error"]["key"] == "content_hidden", answer
    before = Task.objects.get(run=run, key="r1.1").status
    assert before in ("needs_approval", "awaiting_input")  # nothing changed
    status, answer = team.api("operator").post(path, body)  # its creator
    assert status == 200, answer
    assert Task.objects.get(run=run, key="r1.1").status == after


@pytest.mark.spec("S5", "F11")
def test_the_kernel_refuses_the_verb_itself(team: Team, colleague: Any) -> None:
    run = private_approval(team)
    with pytest.raises(kernel.KernelError) as refused:
        kernel.approve(run_id=run.pk, key="r1.1", user=colleague)
    assert (refused.value.status, refused.value.key) == (403, "content_hidden")


@pytest.mark.spec("S5", "F11")
@pytest.mark.parametrize(("verb", "make", "body", "after"), DECISIONS, ids=[d[0] for d in DECISIONS])
def test_the_console_refuses_a_decision_to_whoever_cannot_read_the_call(
    team: Team, colleague: Any, verb: str, make: Any, body: dict[str, str], after: str
) -> None:
    run = make(team)
    url = f"/runs/{run.pk}/tasks/r1.1/{verb}/"
    client = Client()
    client.force_login(colleague)
    htmx = client.post(url, body, HTTP_HX_REQUEST="true")
    assert htmx.status_code == 403 and htmx["HX-Retarget"] == "#toasts"
    assert b"read" in htmx.content
    page = client.post(url, body)
    assert page.status_code == 403
    assert Task.objects.get(run=run, key="r1.1").status in ("needs_approval", "awaiting_input")
    creator = Client()
    creator.force_login(team.users["operator"])
    assert creator.post(url, body, HTTP_HX_REQUEST="true").status_code == 200
    assert Task.objects.get(run=run, key="r1.1").status == after


@pytest.mark.spec("S5", "F11")
def test_the_inbox_shows_a_call_its_reader_cannot_read_as_not_actionable(team: Team, colleague: Any) -> None:
    run = private_approval(team)
    status, page = Api(make_token(user=colleague)).get(f"/inbox?workspace={team.slug}")
    assert status == 200
    [item] = page["items"]
    assert item["actionable"] is False and item["content_visible"] is False
    assert "args" not in item and "digest" not in item
    _, own = team.api("operator").get(f"/inbox?workspace={team.slug}")
    assert own["items"][0]["actionable"] is True and own["items"][0]["digest"]
    _, as_viewer = team.api("viewer").get(f"/inbox?workspace={team.slug}")
    assert as_viewer["items"][0]["actionable"] is False

    client = Client()
    client.force_login(colleague)
    for url in (f"/w/{team.slug}/inbox/", f"/runs/{run.pk}/"):
        html = client.get(url).content.decode()
        assert f"/runs/{run.pk}/tasks/r1.1/approve/" not in html, url
        assert "not-actionable" in html and "/etc/secret" not in html, url
    creator = Client()
    creator.force_login(team.users["operator"])
    html = creator.get(f"/w/{team.slug}/inbox/").content.decode()
    assert f"/runs/{run.pk}/tasks/r1.1/approve/" in html and "not-actionable" not in html
