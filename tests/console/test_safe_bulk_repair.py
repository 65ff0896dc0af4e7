"""Safe bulk repair (issue 30.5): the preview says whose each run is (creator, private), what
failed (its message as the viewer's role may read it) and how long it has waited; it counts the
runs that are other people's and the private ones before the click; rows can be unticked and only
ticked runs are repaired, each id checked again by the server; "created by me" keeps a person's
own runs. In Chromium: untick one, confirm, and only the ticked are repaired."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from django.test import Client

from runs.models import Run, Task
from tests.conftest import Team, wait_for
from tests.console import states
from tests.console.bulk_holds import held, verb_events
from tests.factories import make_member, make_workspace

PREVIEW = "/w/{ws}/holds/bulk/preview/"
APPLY = "/w/{ws}/holds/bulk/apply/"


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def mixed_holds(team: Team) -> dict[str, Run]:
    """The operator's own run, the operator's own private run, a colleague's run and a colleague's private run."""
    operator = team.users["operator"]
    colleague = make_member(workspace=team.workspace, role="operator", username=f"colleague-{uuid.uuid4().hex[:6]}")
    states.agent("triage", team.workspace)
    return {
        "own": held(team.workspace, operator, agent="triage"),
        "own_private": held(team.workspace, operator, agent="triage", private=True),
        "theirs": held(team.workspace, colleague, agent="triage"),
        "theirs_private": held(team.workspace, colleague, agent="triage", private=True),
    }


def preview(team: Team, form: dict[str, Any], user: Any = None) -> str:
    response = client_for(user or team.users["operator"]).post(PREVIEW.format(ws=team.slug), form, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    return response.content.decode()


def row(html: str, run: Run) -> str:
    match = re.search(rf'<tr data-run="{run.pk}".*?</tr>', html, re.S)
    assert match, f"no row for {run.pk}"
    return match.group(0)


@pytest.mark.django_db
@pytest.mark.spec("S14", "F11")
def test_the_preview_says_whose_each_run_is_and_counts_others_and_private(team: Team, no_dispatch: list[int]) -> None:
    runs = mixed_holds(team)
    colleague = runs["theirs"].created_by
    assert colleague is not None
    html = preview(team, {"verb": "retry", "agent": "triage"})
    assert 'data-count="4"' in html
    # Of the four, two are a colleague's and two private: said above the rows and in the confirm.
    assert 'data-others="2" data-private="2"' in html
    assert "Of these 4 runs, 2 are other people's and 2 are private." in html
    assert "Retry 4 held runs of agent triage? 2 of them are other people's, 2 private." in html
    own, theirs = row(html, runs["own"]), row(html, runs["theirs"])
    assert ">you<" in own and colleague.username in theirs and "data-mine" in own and "data-mine" not in theirs
    assert "badge-private" in row(html, runs["own_private"]) and "badge-private" not in own
    for run in runs.values():  # each row ticked, with its agent, failure key and age
        cells = row(html, run)
        assert f'type="checkbox" name="runs" value="{run.pk}" checked' in cells
        assert "triage" in cells and "<code>tool_failed</code>" in cells and 'data-rel="ago"' in cells
    # The failure's words as the viewer may read them: never a colleague's private run's (F11).
    assert "secret words of t0" in own and "secret words of t0" in row(html, runs["own_private"])
    assert "secret words of t0" in theirs
    hidden = row(html, runs["theirs_private"])
    assert "secret words" not in hidden and f"private run of {colleague.username}" in hidden


@pytest.mark.django_db
@pytest.mark.spec("S14")
def test_created_by_me_keeps_only_the_persons_own_runs(team: Team, no_dispatch: list[int]) -> None:
    runs = mixed_holds(team)
    html = preview(team, {"verb": "retry", "mine": "1"})
    assert 'data-count="2"' in html and "Retry 2 held runs created by you" in html
    assert str(runs["own"].pk) in html and str(runs["own_private"].pk) in html
    assert str(runs["theirs"].pk) not in html and str(runs["theirs_private"].pk) not in html
    assert 'data-others="0" data-private="1"' in html
    assert '<input type="hidden" name="mine" value="1">' in html  # the confirm keeps the filter
    # "Me" is whoever asks: the colleague's "created by me" is theirs.
    colleague = runs["theirs"].created_by
    theirs = preview(team, {"verb": "retry", "mine": "1"}, user=colleague)
    assert str(runs["theirs"].pk) in theirs and str(runs["own"].pk) not in theirs
    # Only the own runs: a confirm sentence with nothing about others.
    own_only = preview(team, {"verb": "retry", "mine": "1", "runs": [str(runs["own"].pk)]})
    assert "All 1 is yours." in own_only and "Each run is repaired as one click would" in own_only


@pytest.mark.django_db
@pytest.mark.spec("S14")
def test_only_ticked_runs_are_repaired_and_each_id_is_checked_again(team: Team, no_dispatch: list[int]) -> None:
    runs = mixed_holds(team)
    client = client_for(team.users["operator"])
    apply = APPLY.format(ws=team.slug)
    # Unticked rows are not sent: of the own runs, one ticked, one left.
    answer = client.post(apply, {"verb": "retry", "mine": "1", "runs": [str(runs["own"].pk)]}).content.decode()
    assert answer.count('data-outcome="retried"') == 1
    assert verb_events(runs["own"], "retry") == {"t0": 1} and not verb_events(runs["own_private"], "retry")
    # A crafted form: a colleague's run under "created by me" is refused under its lock, not repaired.
    crafted = client.post(apply, {"verb": "retry", "mine": "1", "runs": [str(runs["theirs"].pk)]}).content.decode()
    assert 'data-outcome="skipped"' in crafted and 'data-reason="no_longer_matches"' in crafted
    assert not verb_events(runs["theirs"], "retry")
    # Another workspace's held run named by id: not this workspace's, so nothing.
    elsewhere = make_workspace()
    other = held(elsewhere, make_member(workspace=elsewhere, role="operator"))
    answer = client.post(apply, {"verb": "retry", "all": "1", "runs": [str(other.pk)]}).content.decode()
    assert 'data-reason="not_held"' in answer and not verb_events(other, "retry")
    # Nothing ticked: a typed refusal, never "whatever the filter matches now".
    for form in ({"verb": "retry", "agent": "triage"}, {"verb": "retry", "all": "1"}):
        htmx = client.post(apply, form, HTTP_HX_REQUEST="true")
        assert htmx.status_code == 200 and 'data-error="no_runs_ticked"' in htmx.content.decode()
        plain = client.post(apply, form)
        assert plain.status_code == 400 and 'data-error="no_runs_ticked"' in plain.content.decode()
    for key in ("own_private", "theirs", "theirs_private"):
        assert Task.objects.get(run=runs[key], key="t0").failure_resolution is None


@pytest.mark.django_db
@pytest.mark.parametrize(("role", "status"), [("operator", 200), ("reader", 403), ("viewer", 403), ("outsider", 404)])
def test_created_by_me_needs_operator_standing_like_any_bulk_request(
    team: Team, no_dispatch: list[int], role: str, status: int
) -> None:
    run = held(team.workspace, team.users["operator"])
    for template in (PREVIEW, APPLY):
        response = client_for(team.users[role]).post(
            template.format(ws=team.slug), {"verb": "abandon", "mine": "1", "runs": [str(run.pk)]}, HTTP_HX_REQUEST="true"
        )
        assert response.status_code == status
    assert (Task.objects.get(run=run, key="t0").failure_resolution == "abandoned") == (status == 200)


@pytest.mark.django_db
@pytest.mark.spec("S14")
def test_the_api_preview_counts_others_and_private_and_takes_mine(team: Team, no_dispatch: list[int]) -> None:
    runs = mixed_holds(team)
    status, body = team.api().post(f"/workspaces/{team.slug}/holds/retry", {"agent": "triage", "dry_run": True})
    assert status == 200, body
    assert (body["count"], body["others"], body["private"], body["others_private"]) == (4, 2, 2, 1)
    by_run = {item["run"]: item for item in body["runs"]}
    assert by_run[str(runs["theirs_private"].pk)]["private"] is True and by_run[str(runs["own"].pk)]["mine"] is True
    assert all("message" not in item for item in body["runs"])  # the API's preview holds no words
    status, mine = team.api().post(f"/workspaces/{team.slug}/holds/retry", {"mine": True, "dry_run": True})
    assert status == 200 and {item["run"] for item in mine["runs"]} == {str(runs["own"].pk), str(runs["own_private"].pk)}
    status, bad = team.api().post(f"/workspaces/{team.slug}/holds/retry", {"mine": "yes", "dry_run": True})
    assert status == 400 and bad["error"]["key"] == "invalid_filter"


# ---- in the browser ----


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def flaky_held(team: Team, user: Any, *, private: bool = False) -> Run:
    """A held run whose failed tool succeeds when retried (test.flaky fails once per id)."""
    from runs import kernel

    body: dict[str, Any] = {
        "agent": "safe-bot",
        "private": private,
        "tasks": [
            {
                "key": "a",
                "kind": "tool",
                "tool": "test.flaky",
                "args": {"fail_times": 1, "id": uuid.uuid4().hex},
                "after": [],
                "on_failure": "halt",
            },
            {"key": "c", "kind": "tool", "tool": "test.echo", "args": {"value": 5}, "after": ["a"]},
        ],
        "deliverable": "c",
    }
    run, _ = kernel.create_run(workspace=team.workspace, user=user, body=body)
    return run


@pytest.mark.browser
@pytest.mark.live
@pytest.mark.spec("S14")
@pytest.mark.usefixtures("committed")
def test_in_the_browser_the_preview_tells_whose_runs_and_repairs_only_the_ticked(live_team: Team, browsers: Any) -> None:
    states.agent("safe-bot", live_team.workspace)
    operator = live_team.users["operator"]
    colleague = make_member(workspace=live_team.workspace, role="operator", username=f"colleague-{uuid.uuid4().hex[:6]}")
    own = flaky_held(live_team, operator)
    theirs = flaky_held(live_team, colleague)
    secret = flaky_held(live_team, colleague, private=True)
    ids = [own.pk, theirs.pk, secret.pk]
    wait_for(lambda: Run.objects.filter(pk__in=ids, status="needs_attention").count() == 3, message="3 runs held")

    browser = browsers()
    browser.sign_in(operator.username)
    page = browser.open(f"/w/{live_team.slug}/holds/")
    page.fill('#bulk-form input[name="agent"]', "safe-bot")
    page.click('button[data-bulk-preview="retry"]')
    expect(page.locator(".bulk-sentence")).to_have_text("Retry 3 held runs of agent safe-bot")
    expect(page.locator(".bulk-whose")).to_contain_text("Of these 3 runs, 2 are other people's and 1 is private.")
    expect(page.locator(f'tr[data-run="{secret.pk}"] .redacted')).to_have_text(f"private run of {colleague.username}")
    browser.shot("bulk-repair-whose")

    # Untick the colleague's two: the count, the button and the confirm's words follow.
    page.uncheck(f"#tick-{theirs.pk}")
    page.uncheck(f"#tick-{secret.pk}")
    expect(page.locator("[data-ticked]")).to_have_text("1")
    confirm = page.locator('button[data-bulk-confirm="retry"]')
    expect(confirm).to_have_text("Retry 1 ticked run")
    assert (page.locator("#bulk-confirm").get_attribute("hx-confirm") or "").startswith("Retry 1 ticked run? Each run")
    confirm.click()
    expect(page.locator("#bulk-progress")).to_have_text("Finished: 1 of 1 runs done.", timeout=30_000)
    expect(page.locator('#bulk-rows [data-outcome="retried"]')).to_have_count(1)
    wait_for(lambda: Run.objects.get(pk=own.pk).status == "completed", message="the ticked run completed")
    assert Run.objects.get(pk=theirs.pk).status == "needs_attention" and Run.objects.get(pk=secret.pk).status == "needs_attention"
    assert not verb_events(theirs, "retry") and not verb_events(secret, "retry")

    # "Created by me": the colleague's runs are not even offered.
    page.fill('#bulk-form input[name="agent"]', "")
    page.check('#bulk-form input[name="mine"]')
    page.click('button[data-bulk-preview="abandon"]')
    expect(page.locator(".bulk-preview")).to_have_attribute("data-count", "0")
    assert not [e for e in browser.errors if "Content Security Policy" in e or "Refused" in e], browser.errors
