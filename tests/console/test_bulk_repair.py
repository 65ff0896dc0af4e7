"""The Holds page's bulk repair: the panel and the checkboxes, the preview that names what will
happen, the confirmed repair in chunks with its progress, the role matrix and bad filters; and in
Chromium, select → preview → confirm → results."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from django.test import Client

from runs.models import Run, Task
from runs.repair import CHUNK
from tests.conftest import Team, wait_for
from tests.console import states
from tests.console.bulk_holds import held, verb_events

PREVIEW = "/w/{ws}/holds/bulk/preview/"
APPLY = "/w/{ws}/holds/bulk/apply/"


def client_for(team: Team, role: str) -> Client:
    client = Client()
    client.force_login(team.users[role])
    return client


def url(team: Team, template: str) -> str:
    return template.format(ws=team.slug)


@pytest.mark.django_db
def test_the_holds_page_offers_bulk_repair_to_an_operator_only(team: Team, no_dispatch: list[int]) -> None:
    run = held(team.workspace, team.users["operator"])
    page = client_for(team, "operator").get(f"/w/{team.slug}/holds/").content.decode()
    assert 'id="bulk-form"' in page and f'id="pick-{run.pk}"' in page and 'form="bulk-form"' in page
    for role in ("reader", "viewer"):
        page = client_for(team, role).get(f"/w/{team.slug}/holds/").content.decode()
        assert "bulk-form" not in page and "bulk-pick" not in page
    assert "<script>" not in page and "style=" not in page  # CSP: no inline scripts or styles


@pytest.mark.django_db
@pytest.mark.spec("S14")
@pytest.mark.parametrize("template", [PREVIEW, APPLY])
@pytest.mark.parametrize(("role", "status"), [("operator", 200), ("reader", 403), ("viewer", 403), ("outsider", 404)])
def test_the_bulk_views_need_operator_standing(team: Team, no_dispatch: list[int], template: str, role: str, status: int) -> None:
    run = held(team.workspace, team.users["operator"])
    response = client_for(team, role).post(url(team, template), {"verb": "retry", "runs": [str(run.pk)]}, HTTP_HX_REQUEST="true")
    assert response.status_code == status
    retried = Task.objects.get(run=run, key="t0").failure_resolution == "retried"
    assert retried == (status == 200 and template == APPLY)


@pytest.mark.django_db
def test_the_bulk_views_take_only_a_signed_in_post(team: Team) -> None:
    assert Client().post(url(team, PREVIEW), {"verb": "retry", "all": "1"}).status_code == 302  # to sign in
    assert client_for(team, "operator").get(url(team, PREVIEW)).status_code == 405
    assert client_for(team, "operator").get(url(team, APPLY)).status_code == 405


@pytest.mark.django_db
@pytest.mark.spec("S14", "S15")
def test_the_preview_names_what_will_happen_and_confirm_repairs_exactly_those(team: Team, no_dispatch: list[int]) -> None:
    operator = team.users["operator"]
    states.agent("triage", team.workspace)
    timeouts = [held(team.workspace, operator, agent="triage", errors=("tool_timeout",)) for _ in range(CHUNK + 2)]
    other_kind = held(team.workspace, operator, agent="triage")
    client = client_for(team, "operator")
    form = {"verb": "retry", "agent": "triage", "kind": "timeout", "version": "", "error_key": "", "min_age_seconds": ""}
    preview = client.post(url(team, PREVIEW), form, HTTP_HX_REQUEST="true").content.decode()
    sentence = f"Retry {CHUNK + 2} held runs of agent triage, kind timeout"
    assert sentence in preview and f'data-count="{CHUNK + 2}"' in preview
    assert f'hx-confirm="{sentence}? Each run is repaired as one click would; this cannot be undone."' in preview
    assert str(other_kind.pk) not in preview
    assert not any(verb_events(run, "retry") for run in timeouts), "a preview writes nothing"

    # The confirm form sends what the preview listed; htmx answers a chunk and fetches the next.
    confirm = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', preview.split('id="bulk-confirm">')[1]))
    ids = re.findall(r'name="runs" value="([0-9a-f-]+)"', preview)
    assert ids == [str(run.pk) for run in timeouts]
    first = client.post(url(team, APPLY), {**confirm, "runs": ids}, HTTP_HX_REQUEST="true")
    html = first.content.decode()
    assert html.count('data-outcome="retried"') == CHUNK and f"Working: {CHUNK} of {CHUNK + 2}" in html
    assert 'hx-trigger="load"' in html and "HX-Trigger" not in first.headers
    rest = re.findall(r'name="runs" value="([0-9a-f-]+)"', html)
    assert rest == ids[CHUNK:]
    following = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', html))
    second = client.post(url(team, APPLY), {**following, "runs": rest}, HTTP_HX_REQUEST="true")
    html = second.content.decode()
    assert html.count('data-outcome="retried"') == 2 and f"Finished: {CHUNK + 2} of {CHUNK + 2}" in html
    assert 'hx-trigger="load"' not in html and second.headers["HX-Trigger"] == "oz0:changed"
    for run in timeouts:
        assert verb_events(run, "retry") == {"t0": 1}
    assert Run.objects.get(pk=other_kind.pk).status == "needs_attention"

    # Confirmed again (a second tab): every run is skipped with who repaired it, none twice.
    again = client.post(url(team, APPLY), {**confirm, "runs": ids}).content.decode()
    assert again.count('data-outcome="skipped"') == CHUNK + 2 and f"retried by {operator.username}" in again
    assert all(verb_events(run, "retry") == {"t0": 1} for run in timeouts)


@pytest.mark.django_db
@pytest.mark.spec("S14")
def test_checked_runs_are_abandoned_without_htmx_too(team: Team, no_dispatch: list[int]) -> None:
    runs = [held(team.workspace, team.users["operator"]) for _ in range(3)]
    client = client_for(team, "operator")
    response = client.post(url(team, APPLY), {"verb": "abandon", "runs": [str(r.pk) for r in runs[:2]]})
    page = response.content.decode()
    assert response.status_code == 200 and page.count('data-outcome="abandoned"') == 2 and "Finished: 2 of 2" in page
    assert [Task.objects.get(run=r, key="t0").failure_resolution for r in runs] == ["abandoned", "abandoned", None]


BAD_FORMS = [
    ({"verb": "delete", "all": "1"}, "invalid_verb"),
    ({"verb": "retry"}, "empty_filter"),
    ({"verb": "retry", "kind": "nonsense"}, "invalid_kind"),
    ({"verb": "retry", "version": "two"}, "invalid_filter"),
    ({"verb": "retry", "version": "9" * 40}, "invalid_filter"),
    ({"verb": "retry", "min_age_seconds": "-5"}, "invalid_filter"),
    ({"verb": "retry", "runs": ["not-a-run"]}, "invalid_run_id"),
    ({"verb": "retry", "runs": [str(uuid.uuid4()) for _ in range(201)]}, "too_many_runs"),
    ({"verb": "retry", "agent": "x" * 500}, "invalid_filter"),
]


@pytest.mark.django_db
def test_a_bad_filter_is_told_in_the_panel_and_writes_nothing(team: Team, no_dispatch: list[int]) -> None:
    run = held(team.workspace, team.users["operator"])
    client = client_for(team, "operator")
    for template in (PREVIEW, APPLY):
        for form, key in BAD_FORMS:
            htmx = client.post(url(team, template), form, HTTP_HX_REQUEST="true")
            assert htmx.status_code == 200 and f'data-error="{key}"' in htmx.content.decode(), (form, key)
            plain = client.post(url(team, template), form)
            assert plain.status_code == 400 and f'data-error="{key}"' in plain.content.decode(), (form, key)
    assert Run.objects.get(pk=run.pk).status == "needs_attention" and not verb_events(run, "retry")


# ---- in the browser ----


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def flaky_held(team: Team, agent: str) -> Run:
    """A held run whose failed tool succeeds when retried (test.flaky fails once per id)."""
    from runs import kernel

    body = {
        "agent": agent,
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
    run, _ = kernel.create_run(workspace=team.workspace, user=team.users["operator"], body=body)
    return run


@pytest.mark.browser
@pytest.mark.live
@pytest.mark.spec("S14")
@pytest.mark.usefixtures("committed")
def test_in_the_browser_an_operator_selects_previews_confirms_and_sees_results(live_team: Team, browsers: Any) -> None:
    states.agent("bulk-bot", live_team.workspace)
    runs = [flaky_held(live_team, "bulk-bot") for _ in range(12)]
    wait_for(
        lambda: Run.objects.filter(pk__in=[r.pk for r in runs], status="needs_attention").count() == 12,
        message="12 runs held",
    )
    operator = browsers()
    operator.sign_in(live_team.users["operator"].username)
    page = operator.open(f"/w/{live_team.slug}/holds/")

    # Two ticked by hand: the preview names them, the confirm retries just those.
    for run in runs[:2]:
        page.check(f"#pick-{run.pk}")
    page.click('button[data-bulk-preview="retry"]')
    expect(page.locator(".bulk-sentence")).to_have_text("Retry 2 held runs among 2 chosen")
    confirm = page.locator('button[data-bulk-confirm="retry"]')
    assert "Retry 2 held runs among 2 chosen?" in (confirm.locator("xpath=..").get_attribute("hx-confirm") or "")
    confirm.click()  # the confirm dialog is accepted
    expect(page.locator("#bulk-progress")).to_have_text("Finished: 2 of 2 runs done.", timeout=30_000)
    expect(page.locator('#bulk-rows [data-outcome="retried"]')).to_have_count(2)
    expect(page.locator('button[data-bulk-confirm="retry"]')).to_have_count(0)  # done: nothing to confirm twice
    operator.shot("bulk-repair-picked")

    # The rest by filter: ten runs of the agent, in chunks, the progress counting up to the end.
    expect(page.locator(f"#pick-{runs[0].pk}")).to_have_count(0, timeout=30_000)  # repaired: off the list
    page.fill('#bulk-form input[name="agent"]', "bulk-bot")
    page.select_option('#bulk-form select[name="kind"]', "tool_failed")
    page.click('button[data-bulk-preview="retry"]')
    expect(page.locator(".bulk-sentence")).to_have_text("Retry 10 held runs of agent bulk-bot, kind tool_failed")
    page.click('button[data-bulk-confirm="retry"]')
    expect(page.locator("#bulk-progress")).to_have_text("Finished: 10 of 10 runs done.", timeout=30_000)
    expect(page.locator('#bulk-rows [data-outcome="retried"]')).to_have_count(10)
    operator.shot("bulk-repair-filtered")
    wait_for(
        lambda: Run.objects.filter(pk__in=[r.pk for r in runs], status="completed").count() == 12, message="all 12 completed"
    )
    for run in runs:
        assert verb_events(run, "retry") == {"a": 1}
    expect(page.locator(".card.hold")).to_have_count(0, timeout=30_000)
    assert not [e for e in operator.errors if "Content Security Policy" in e or "Refused" in e], operator.errors
