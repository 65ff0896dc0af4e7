"""Approvals with context and a safety net (issue 30, item 1), on the console: what a card shows
(agent and version, the model's words, replayable or with effects), the confirmation a call with
effects asks for, edit-then-approve, and approve many identical calls after a preview. Every new
action: GET refused, anonymous, outsider 404, viewer and reader refused, bad input typed, races told."""

from __future__ import annotations

import csv
import io
import re
from typing import Any

import pytest
from django.test import Client

from runs import kernel
from runs.kernel import call_digest
from runs.models import Run, Task, TraceEvent
from tenancy.models import Membership
from tests.conftest import Team
from tests.console import states
from tests.factories import make_member

pytestmark = pytest.mark.django_db


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def said_run(team: Team, *, tool: str = "test.echo", args: dict[str, Any] | None = None, private: bool = False) -> Run:
    """A run of an agent (version 2) whose model said words beside the one call it composed."""
    agent = states.agent("triager", team.workspace, version=2)
    args = args if args is not None else {"value": 1}
    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={
            "agent": agent,
            "tasks": [{"key": "r1", "kind": "round", "model": "script", "prompt": "go", "script": [{"text": "x"}], "after": []}],
            "deliverable": "r1",
            "approval": {"mode": "ask"},
            "private": private,
        },
    )
    r1 = Task.objects.get(run=run, key="r1")
    claimed = kernel.claim_task(None, r1.pk, "test-claim")
    assert claimed is not None
    said = {
        "route": "script",
        "attempt": 1,
        "outcome": "answer",
        "answer": {"text": "I will clean <b>/tmp</b> now.", "tool_calls": []},
    }
    kernel.round_expand(
        claimed, [{"tool": tool, "args": args}], extra={"provider_calls": [said]}, state={}, allowed_tools=None, tool_policies={}
    )
    assert Task.objects.get(run=run, key="r1.1").status == "needs_approval"
    return Run.objects.get(pk=run.pk)


def inbox(team: Team, role: str) -> str:
    return client_for(team.users[role]).get(f"/w/{team.slug}/inbox/").content.decode()


def card(html: str, run: Run) -> str:
    match = re.search(rf'<article[^>]*data-run="{run.pk}".*?</article>', html, re.S)
    assert match, html[:2000]
    return match.group(0)


# ---- what a card shows ----


@pytest.mark.spec("F11", "F12", "S5")
def test_a_card_shows_agent_version_the_models_words_and_effects_redacted_by_role(team: Team) -> None:
    run = said_run(team, tool="test.effect", args={"id": "effect-args-hidden"})
    for role in ("operator", "reader"):
        shown = card(inbox(team, role), run)
        assert "triager" in shown and "v2" in shown
        assert "I will clean &lt;b&gt;/tmp&lt;/b&gt; now." in shown  # the model's words, escaped
        assert 'data-effects="true"' in shown and "has effects" in shown
    viewer = card(inbox(team, "viewer"), run)
    assert "triager" in viewer and "v2" in viewer and "has effects" in viewer
    assert "I will clean" not in viewer and "effect-args-hidden" not in viewer
    assert "The model's words and the arguments are hidden from your role." in viewer


@pytest.mark.spec("F11")
def test_someone_elses_private_run_shows_no_words_to_another_operator(team: Team) -> None:
    run = said_run(team, private=True)
    other = make_member(workspace=team.workspace, role="operator")
    shown = card(client_for(other).get(f"/w/{team.slug}/inbox/").content.decode(), run)
    assert "I will clean" not in shown and "Edit, then approve" not in shown


def test_a_replayable_call_is_marked_so_and_asks_no_confirmation(team: Team) -> None:
    run = said_run(team)
    shown = card(inbox(team, "operator"), run)
    assert "replayable" in shown and 'name="confirm_effects"' not in shown
    assert "Edit, then approve" in shown


def test_the_api_item_carries_the_same_context(team: Team) -> None:
    run = said_run(team, tool="test.effect", args={"id": "e1"})
    status, body = team.api("reader").get(f"/inbox?workspace={team.slug}")
    assert status == 200
    [item] = [i for i in body["items"] if i["run"] == str(run.pk)]
    assert item["agent_version"] == 2 and item["replayable"] is False
    assert item["model_message"] == "I will clean <b>/tmp</b> now."
    [closed] = [i for i in team.api("viewer").get(f"/inbox?workspace={team.slug}")[1]["items"] if i["run"] == str(run.pk)]
    assert "model_message" not in closed and closed["replayable"] is False


# ---- a call with effects asks for a confirmation ----


@pytest.mark.spec("S10")
def test_approving_a_call_with_effects_needs_its_confirmation(team: Team) -> None:
    run = said_run(team, tool="test.effect", args={"id": "e1"})
    shown = card(inbox(team, "operator"), run)
    assert re.search(r'<input type="checkbox" name="confirm_effects" value="1" required>', shown)
    client = client_for(team.users["operator"])
    url = f"/runs/{run.pk}/tasks/r1.1/approve/"
    refused = client.post(url, {"digest": call_digest("test.effect", {"id": "e1"})}, HTTP_HX_REQUEST="true")
    assert b'data-outcome="refused"' in refused.content and b"Confirm the effects" in refused.content
    assert Task.objects.get(run=run, key="r1.1").status == "needs_approval"
    approved = client.post(
        url, {"digest": call_digest("test.effect", {"id": "e1"}), "confirm_effects": "1"}, HTTP_HX_REQUEST="true"
    )
    assert b'data-outcome="ok"' in approved.content
    assert Task.objects.get(run=run, key="r1.1").status != "needs_approval"


# ---- edit, then approve ----


def edit_url(run: Run) -> str:
    return f"/runs/{run.pk}/tasks/r1.1/approve-edited/"


def edit_form(args: str, digest: str | None = None) -> dict[str, str]:
    return {"args": args, "digest": digest or call_digest("test.echo", {"value": 1})}


@pytest.mark.spec("S5", "S6")
def test_an_operator_edits_then_approves_and_the_audit_shows_both(team: Team) -> None:
    run = said_run(team)
    response = client_for(team.users["operator"]).post(edit_url(run), edit_form('{"value": 2}'), HTTP_HX_REQUEST="true")
    assert b'data-outcome="ok"' in response.content and b"Approved as edited" in response.content
    call = Task.objects.get(run=run, key="r1.1")
    assert call.spec["args"] == {"value": 2} and call.approved_digest == call_digest("test.echo", {"value": 2})
    trail = client_for(team.users["reader"]).get(f"/api/v1/workspaces/{team.slug}/audit").json()
    [entry] = [e for e in trail["items"] if e["run"] == str(run.pk)]
    assert entry["verb"] == "approve" and entry["edited"] is True
    assert entry["original_args"] == {"value": 1} and entry["args"] == {"value": 2}
    closed = client_for(team.users["viewer"]).get(f"/api/v1/workspaces/{team.slug}/audit").json()
    [entry] = [e for e in closed["items"] if e["run"] == str(run.pk)]
    assert entry["edited"] is True and entry["original_args"] is None and entry["args"] is None


BAD_EDITS = [
    ("malformed JSON", "{value: 2", "Not valid JSON"),
    ("not an object", "[1, 2]", "Not valid arguments"),
    ("empty", "   ", "Not valid arguments"),
    ("huge", '{"value": "' + "x" * (70 * 1024) + '"}', "Too large"),
    ("exponent number", '{"value": 1e5}', "Refused"),
]


@pytest.mark.parametrize(("name", "text", "title"), BAD_EDITS, ids=[b[0] for b in BAD_EDITS])
def test_a_bad_edit_is_told_typed_and_changes_nothing(team: Team, name: str, text: str, title: str) -> None:
    run = said_run(team)
    response = client_for(team.users["operator"]).post(edit_url(run), edit_form(text), HTTP_HX_REQUEST="true")
    assert b'data-outcome="refused"' in response.content and title.encode() in response.content, response.content[:500]
    call = Task.objects.get(run=run, key="r1.1")
    assert call.status == "needs_approval" and call.spec["args"] == {"value": 1}
    assert not TraceEvent.objects.filter(run=run, event="verb").exists()


def test_an_edit_of_a_call_that_changed_is_stale(team: Team) -> None:
    run = said_run(team)
    stale = edit_form('{"value": 2}', digest=call_digest("test.echo", {"value": 9}))
    response = client_for(team.users["operator"]).post(edit_url(run), stale, HTTP_HX_REQUEST="true")
    assert b"The call changed" in response.content
    assert Task.objects.get(run=run, key="r1.1").spec["args"] == {"value": 1}


@pytest.mark.spec("S6")
def test_the_second_operator_is_told_who_decided_first(team: Team) -> None:
    run = said_run(team)
    client_for(team.users["operator"]).post(f"/runs/{run.pk}/tasks/r1.1/deny/", {"reason": "no"}, HTTP_HX_REQUEST="true")
    other = client_for(make_member(workspace=team.workspace, role="operator"))
    response = other.post(edit_url(run), edit_form('{"value": 2}'), HTTP_HX_REQUEST="true").content.decode()
    assert "Already decided" in response and f"denied by {team.users['operator'].username}" in response
    assert Task.objects.get(run=run, key="r1.1").spec["args"] == {"value": 1}


@pytest.mark.spec("S32", "F11")
def test_the_role_matrix_of_edit_then_approve(team: Team) -> None:
    run = said_run(team)
    url = edit_url(run)
    assert client_for(team.users["operator"]).get(url).status_code == 405
    anonymous = Client().post(url, edit_form('{"value": 2}'))
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    assert client_for(team.users["outsider"]).post(url, edit_form('{"value": 2}')).status_code == 404
    for role in ("viewer", "reader"):
        assert client_for(team.users[role]).post(url, edit_form('{"value": 2}')).status_code == 403
        assert client_for(team.users[role]).post(url, edit_form('{"value": 2}'), HTTP_HX_REQUEST="true").status_code == 403
    private = said_run(team, private=True)
    other = client_for(make_member(workspace=team.workspace, role="operator"))
    assert other.post(edit_url(private), edit_form('{"value": 2}')).status_code == 403
    assert Task.objects.get(run=run, key="r1.1").spec["args"] == {"value": 1}
    assert Task.objects.get(run=private, key="r1.1").spec["args"] == {"value": 1}
    # Without JavaScript: the edit is made and the person is sent back.
    done = client_for(team.users["operator"]).post(url, {**edit_form('{"value": 2}'), "next": f"/w/{team.slug}/inbox/"})
    assert done.status_code == 302 and done["Location"] == f"/w/{team.slug}/inbox/"
    assert Task.objects.get(run=run, key="r1.1").spec["args"] == {"value": 2}


# ---- approve many ----


def many_url(team: Team) -> str:
    return f"/w/{team.slug}/inbox/approve-many/"


def preview(client: Client, team: Team, run: Run) -> str:
    response = client.get(many_url(team), {"run": str(run.pk), "task": "r1.1"})
    assert response.status_code == 200
    return response.content.decode()


def test_identical_calls_across_runs_are_previewed_then_approved_in_one_step(team: Team) -> None:
    runs = [said_run(team, args={"value": "same"}) for _ in range(3)]
    other = said_run(team, args={"value": "different"})
    shown = card(inbox(team, "operator"), runs[0])
    assert "Approve all 3 identical calls" in shown
    assert "identical calls" not in card(inbox(team, "operator"), other)
    client = client_for(team.users["operator"])
    page = preview(client, team, runs[0])
    for run in runs:
        assert f'value="{run.pk}:r1.1"' in page
    assert f'value="{other.pk}:r1.1"' not in page
    digest = call_digest("test.echo", {"value": "same"})
    response = client.post(many_url(team), {"digest": digest, "call": [f"{r.pk}:r1.1" for r in runs]})
    assert b"Approved 3 of 3." in response.content
    for run in runs:
        assert Task.objects.get(run=run, key="r1.1").approved_digest == digest
    assert Task.objects.get(run=other, key="r1.1").status == "needs_approval"


@pytest.mark.spec("S6")
def test_a_call_decided_meanwhile_is_told_and_the_rest_approved(team: Team) -> None:
    runs = [said_run(team, args={"value": "same"}) for _ in range(2)]
    client = client_for(team.users["operator"])
    preview(client, team, runs[0])
    kernel.deny(run_id=runs[1].pk, key="r1.1", user=team.users["operator"], reason="no")
    digest = call_digest("test.echo", {"value": "same"})
    response = client.post(many_url(team), {"digest": digest, "call": [f"{r.pk}:r1.1" for r in runs]}).content.decode()
    assert "Approved 1 of 2." in response
    assert f"already denied by {team.users['operator'].username}; it is now failed" in response
    assert Task.objects.get(run=runs[1], key="r1.1").status == "failed"


def test_a_call_changed_meanwhile_is_not_approved(team: Team) -> None:
    runs = [said_run(team, args={"value": "same"}) for _ in range(2)]
    changed = call_digest("test.echo", {"value": "other"})
    response = (
        client_for(team.users["operator"])
        .post(many_url(team), {"digest": changed, "call": [f"{r.pk}:r1.1" for r in runs]})
        .content.decode()
    )
    assert "Approved 0 of 2." in response and response.count('data-outcome="approval_stale"') == 2
    assert all(Task.objects.get(run=r, key="r1.1").approved_digest is None for r in runs)


def test_approving_many_calls_with_effects_needs_the_confirmation(team: Team) -> None:
    runs = [said_run(team, tool="test.effect", args={"id": "same"}) for _ in range(2)]
    client = client_for(team.users["operator"])
    assert 'name="confirm_effects" value="1" required' in preview(client, team, runs[0])
    digest = call_digest("test.effect", {"id": "same"})
    calls = [f"{r.pk}:r1.1" for r in runs]
    refused = client.post(many_url(team), {"digest": digest, "call": calls}).content.decode()
    assert "Approved 0 of 2." in refused and refused.count('data-outcome="effects_unconfirmed"') == 2
    confirmed = client.post(many_url(team), {"digest": digest, "call": calls, "confirm_effects": "1"}).content.decode()
    assert "Approved 2 of 2." in confirmed


BAD_MANY = [
    ("no call", {"digest": "a" * 64}, "missing_field"),
    ("a malformed call", {"digest": "a" * 64, "call": ["nope"]}, "invalid_field"),
    ("a malformed digest", {"digest": "xyz", "call": ["00000000-0000-0000-0000-000000000000:r1.1"]}, "invalid_field"),
    (
        "too many calls",
        {"digest": "a" * 64, "call": [f"00000000-0000-0000-0000-{i:012d}:r1.1" for i in range(101)]},
        "too_many_calls",
    ),
]


@pytest.mark.parametrize(("name", "data", "key"), BAD_MANY, ids=[b[0] for b in BAD_MANY])
def test_bad_approve_many_input_is_typed(team: Team, name: str, data: dict[str, Any], key: str) -> None:
    response = client_for(team.users["operator"]).post(many_url(team), data)
    assert response.status_code == 400 and f'data-key="{key}"' in response.content.decode()


def test_a_call_of_another_workspace_is_not_found(team: Team) -> None:
    elsewhere = Team()
    run = said_run(elsewhere)
    # An operator of both workspaces posts the other workspace's call to this one's page.
    Membership.objects.create(workspace=elsewhere.workspace, user=team.users["operator"], role="operator")
    digest = call_digest("test.echo", {"value": 1})
    response = client_for(team.users["operator"]).post(many_url(team), {"digest": digest, "call": [f"{run.pk}:r1.1"]})
    assert 'data-outcome="not_found"' in response.content.decode()
    assert Task.objects.get(run=run, key="r1.1").status == "needs_approval"


@pytest.mark.spec("S32", "F11")
def test_the_role_matrix_of_approve_many(team: Team) -> None:
    run = said_run(team)
    query = {"run": str(run.pk), "task": "r1.1"}
    form = {"digest": call_digest("test.echo", {"value": 1}), "call": [f"{run.pk}:r1.1"]}
    assert Client().get(many_url(team), query).status_code == 302
    assert client_for(team.users["outsider"]).get(many_url(team), query).status_code == 404
    assert client_for(team.users["outsider"]).post(many_url(team), form).status_code == 404
    for role in ("viewer", "reader"):
        assert client_for(team.users[role]).get(many_url(team), query).status_code == 403
        assert client_for(team.users[role]).post(many_url(team), form).status_code == 403
    assert client_for(team.users["operator"]).put(many_url(team)).status_code == 405
    assert Task.objects.get(run=run, key="r1.1").status == "needs_approval"
    # Someone else's private run: never listed, never approved blind.
    private = said_run(team, private=True)
    other = client_for(make_member(workspace=team.workspace, role="operator"))
    gone = other.get(many_url(team), {"run": str(private.pk), "task": "r1.1"}).content.decode()
    assert "no longer waits for approval" in gone
    assert f"{private.pk}:r1.1" not in other.get(many_url(team), query).content.decode()
    response = other.post(many_url(team), {**form, "call": [f"{private.pk}:r1.1"]}).content.decode()
    assert 'data-outcome="content_hidden"' in response
    assert Task.objects.get(run=private, key="r1.1").status == "needs_approval"
    # A malformed anchor is not there.
    assert client_for(team.users["operator"]).get(many_url(team), {"run": "nope", "task": "r1.1"}).status_code == 404


@pytest.mark.spec("F11", "F12")
def test_the_audit_page_and_csv_show_an_edited_approval_with_both_calls_to_readers_only(team: Team) -> None:
    run = said_run(team, args={"value": "first words"})
    digest = call_digest("test.echo", {"value": "first words"})
    kernel.approve_edited(run_id=run.pk, key="r1.1", user=team.users["operator"], digest=digest, args={"value": "second words"})
    reader = client_for(team.users["reader"]).get(f"/w/{team.slug}/audit/").content.decode()
    assert "audit-edited" in reader and "first words" in reader and "second words" in reader
    viewer = client_for(team.users["viewer"]).get(f"/w/{team.slug}/audit/").content.decode()
    assert "audit-edited" in viewer and "first words" not in viewer and "second words" not in viewer
    for role, visible in (("reader", True), ("viewer", False)):
        response = client_for(team.users[role]).get(f"/w/{team.slug}/audit/?format=csv")
        text = b"".join(response.streaming_content).decode()  # type: ignore[attr-defined]
        header, row = list(csv.reader(io.StringIO(text)))[:2]
        cells = dict(zip(header, row, strict=False))
        assert cells["edited"] == "true"
        assert ("first words" in text and "second words" in text) is visible


def test_the_run_page_card_carries_the_same_context_and_controls(team: Team) -> None:
    run = said_run(team, tool="test.effect", args={"id": "e1"})
    html = client_for(team.users["operator"]).get(f"/runs/{run.pk}/").content.decode()
    shown = card(html, run)
    assert "has effects" in shown and "I will clean" in shown and "v2" in shown
    assert 'name="confirm_effects"' in shown and "Edit, then approve" in shown


def test_identical_calls_past_the_scan_are_counted_as_a_lower_bound(team: Team, monkeypatch: pytest.MonkeyPatch) -> None:
    from inbox import approvals

    monkeypatch.setattr(approvals, "IDENTICAL_SCAN", 2)
    runs = [said_run(team, args={"value": "same"}) for _ in range(3)]
    assert "Approve all 2+ identical calls" in card(inbox(team, "operator"), runs[0])
    page = preview(client_for(team.users["operator"]), team, runs[0])
    assert all(f'value="{run.pk}:r1.1"' in page for run in runs)  # the preview lists every one
