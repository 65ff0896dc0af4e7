"""The runs list (issue 30.7): search by run id (whole or its first digits), agent and creator; a
duration column; badges for denied calls and runs a person decided; signed cursors that page their
own filter only; saved filters, a person's own per workspace. The role matrix and bad input (huge,
malformed, crafted cursors: typed 400s, never a 500); in Chromium: search, save, apply, delete."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from django.test import Client

from console.models import SavedRunFilter
from console.saved_filters import MAX_PER_WORKSPACE
from runs import kernel
from runs.models import Run
from runs.run_list import RunFilter, runs_page
from tests.conftest import Team
from tests.console import states
from tests.factories import make_member

ROLES = ("operator", "reader", "viewer")


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def listed(html: str) -> list[str]:
    return re.findall(r'<tr id="run-([0-9a-f-]+)"', html)


def echo_run(team: Team, user: Any, *, agent: str | None = None) -> Run:
    body: dict[str, Any] = {"tasks": [{"key": "a", "kind": "tool", "tool": "test.echo", "args": {"value": 1}, "after": []}]}
    if agent:
        body["agent"] = agent
    run, _ = kernel.create_run(workspace=team.workspace, user=user, body=body)
    return run


def page(team: Team, query: dict[str, Any], role: str = "viewer", **headers: Any) -> Any:
    return client_for(team.users[role]).get(f"/w/{team.slug}/runs/", query, **headers)


@pytest.mark.django_db
def test_it_finds_a_run_by_its_whole_id_or_its_first_digits(team: Team, no_dispatch: list[int]) -> None:
    runs = [echo_run(team, team.users["operator"]) for _ in range(4)]
    target = runs[2]
    for typed in (str(target.pk), str(target.pk).upper(), target.pk.hex, str(target.pk)[:8], str(target.pk)[:11]):
        found = listed(page(team, {"run": typed}).content.decode())
        assert str(target.pk) in found, typed
        assert all(run_id.replace("-", "").startswith(typed.replace("-", "").lower()) for run_id in found), typed
    assert listed(page(team, {"run": str(uuid.uuid4())}).content.decode()) == []


@pytest.mark.django_db
def test_it_searches_by_agent_and_creator_and_status_together(team: Team, no_dispatch: list[int]) -> None:
    states.agent("triage", team.workspace)
    colleague = make_member(workspace=team.workspace, role="operator")
    mine = echo_run(team, team.users["operator"], agent="triage")
    theirs = echo_run(team, colleague, agent="triage")
    other_agent = echo_run(team, colleague)
    html = page(team, {"creator": colleague.username}).content.decode()
    assert set(listed(html)) == {str(theirs.pk), str(other_agent.pk)}
    assert f"created by <strong>{colleague.username}</strong>" in html
    assert set(listed(page(team, {"agent": "triage"}).content.decode())) == {str(mine.pk), str(theirs.pk)}
    both = listed(page(team, {"agent": "triage", "creator": colleague.username}).content.decode())
    assert both == [str(theirs.pk)]
    assert listed(page(team, {"creator": "nobody-by-that-name"}).content.decode()) == []
    assert listed(page(team, {"creator": colleague.username, "status": "completed"}).content.decode()) == []
    # The creator column, and the search's suggestions (the workspace's agents and members).
    html = page(team, {}).content.decode()
    assert f'<td class="creator">{colleague.username}</td>' in html
    assert '<option value="triage">' in html and f'<option value="{colleague.username}">' in html


@pytest.mark.django_db
def test_each_row_has_a_duration_and_badges_for_denials_and_peoples_decisions(team: Team, no_dispatch: list[int]) -> None:
    operator = team.users["operator"]
    denied = states.approval_run(team.workspace, operator)
    kernel.deny(run_id=denied.pk, key="r1.1", user=operator, reason="not now")
    approved = states.approval_run(team.workspace, operator)
    kernel.approve(run_id=approved.pk, key="r1.1", user=operator)
    untouched = echo_run(team, operator)
    html = page(team, {}).content.decode()
    rows = {run_id: re.search(rf'<tr id="run-{run_id}".*?</tr>', html, re.S).group(0) for run_id in listed(html)}  # type: ignore[union-attr]
    assert 'data-badge="denied"' in rows[str(denied.pk)] and "1 denied" in rows[str(denied.pk)]
    assert 'data-badge="decided"' in rows[str(denied.pk)]
    assert 'data-badge="decided"' in rows[str(approved.pk)] and 'data-badge="denied"' not in rows[str(approved.pk)]
    assert "data-badge" not in rows[str(untouched.pk)]
    assert '<th class="num">Duration</th>' in html
    for row in rows.values():  # none of these runs is finished: their durations count on, in the
        # browser (a <time> the page ticks): the row's HTML stays the same from one second to the next
        assert re.search(r'class="num duration"><time datetime="[^"]+" data-rel="ago" title="[^"]+">', row) and "so far" in row
    Run.objects.filter(pk=untouched.pk).update(created_at=Run.objects.get(pk=untouched.pk).created_at)
    finished = echo_run(team, operator)
    Run.objects.filter(pk=finished.pk).update(
        status="completed", finished_at=finished.created_at + __import__("datetime").timedelta(seconds=125)
    )
    html = page(team, {"run": str(finished.pk)}).content.decode()
    assert 'data-seconds="125">2m 05s</td>' in html


@pytest.mark.django_db
def test_its_cursor_pages_its_own_filter_and_no_other(team: Team, no_dispatch: list[int]) -> None:
    colleague = make_member(workspace=team.workspace, role="operator")
    theirs = [echo_run(team, colleague) for _ in range(3)]
    [echo_run(team, team.users["operator"]) for _ in range(2)]
    by_colleague = RunFilter(creator=colleague.username)
    seen: list[str] = []
    cursor = None
    while True:
        answer = runs_page(team.users["viewer"], team.workspace, by_colleague, cursor=cursor, limit=1)
        seen += [item["id"] for item in answer["items"]]
        cursor = answer["next"]
        if not cursor:
            break
        # The same cursor under another filter, or edited, is not one this server gave for it.
        for other, crafted in ((RunFilter(), cursor), (by_colleague, cursor[:-1] + ("0" if cursor[-1] != "0" else "1"))):
            with pytest.raises(kernel.InvalidRequest) as refused:
                runs_page(team.users["viewer"], team.workspace, other, cursor=crafted, limit=1)
            assert refused.value.key == "invalid_cursor"
    assert seen == [str(run.pk) for run in reversed(theirs)]
    # Through the API: the same filters, and a cursor carried to another filter is a typed 400.
    status, first = team.api("viewer").get(f"/workspaces/{team.slug}/runs?creator={colleague.username}&limit=2")
    assert status == 200 and first["count"] == 3 and first["next"]
    status, rest = team.api("viewer").get(
        f"/workspaces/{team.slug}/runs?creator={colleague.username}&limit=2&cursor={first['next']}"
    )
    assert status == 200 and [i["id"] for i in first["items"] + rest["items"]] == seen
    status, bad = team.api("viewer").get(f"/workspaces/{team.slug}/runs?limit=2&cursor={first['next']}")
    assert status == 400 and bad["error"]["key"] == "invalid_cursor"
    # In the console: "Load more" carries the filter with its cursor; a cursor alone is refused.
    html = page(team, {"creator": colleague.username}).content.decode()
    assert "Load more" not in html  # three runs: one page
    response = page(team, {"cursor": first["next"]}, HTTP_HX_REQUEST="true")
    assert response.status_code == 400 and 'data-error="invalid_cursor"' in response.content.decode()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "key"),
    [
        ({"run": "not-hex!"}, "invalid_run"),
        ({"run": "a" * 33}, "invalid_run"),
        ({"run": "x" * 5000}, "invalid_run"),
        ({"status": "bogus"}, "invalid_status"),
        ({"status": "running,bogus"}, "invalid_status"),
        ({"agent": "a" * 5000}, "invalid_agent"),
        ({"creator": "c" * 151}, "invalid_creator"),
        ({"cursor": "%%%"}, "invalid_cursor"),
        ({"cursor": "W10.0000000000000000000000"}, "invalid_cursor"),
        ({"cursor": "x" * 10_000}, "invalid_cursor"),
    ],
)
def test_a_bad_query_is_a_typed_400_on_the_page(team: Team, query: dict[str, str], key: str) -> None:
    for headers in ({}, {"HTTP_HX_REQUEST": "true"}):
        response = page(team, query, **headers)
        assert response.status_code == 400, (query, response.status_code)
        assert f'data-error="{key}"' in response.content.decode()


@pytest.mark.django_db
@pytest.mark.parametrize("role", ROLES)
def test_every_member_reads_the_list_and_an_outsider_gets_404(team: Team, no_dispatch: list[int], role: str) -> None:
    run = echo_run(team, team.users["operator"])
    response = page(team, {"run": str(run.pk)[:6]}, role=role)
    assert response.status_code == 200 and str(run.pk) in response.content.decode()
    assert page(team, {}, role="outsider").status_code == 404
    assert Client().get(f"/w/{team.slug}/runs/").status_code == 302


# ---- saved filters ----


def save(team: Team, role: str, form: dict[str, Any], **headers: Any) -> Any:
    return client_for(team.users[role]).post(f"/w/{team.slug}/runs/filters/", form, **headers)


@pytest.mark.django_db
@pytest.mark.parametrize("role", ROLES)
def test_a_member_saves_applies_and_deletes_their_own_filters(team: Team, role: str) -> None:
    """A saved filter is a person's view of the list, not an act on runs: any member keeps their own."""
    answer = save(team, role, {"name": "  held  triage ", "status": "needs_attention", "agent": "triage"}, HTTP_HX_REQUEST="true")
    assert answer.status_code == 200
    html = answer.content.decode()
    assert 'data-saved="held triage"' in html and "?status=needs_attention&amp;agent=triage" in html
    row = SavedRunFilter.objects.get(user=team.users[role])
    assert row.query == {"status": "needs_attention", "agent": "triage"} and row.workspace == team.workspace
    # Saving the name again replaces it; the list page shows the person's filters, and only theirs.
    save(team, role, {"name": "held triage", "status": "running"})
    assert SavedRunFilter.objects.get(user=team.users[role]).query == {"status": "running"}
    listed_page = page(team, {}, role=role).content.decode()
    assert 'data-saved="held triage"' in listed_page and "?status=running" in listed_page
    other = "viewer" if role != "viewer" else "reader"
    assert 'data-saved="held triage"' not in page(team, {}, role=other).content.decode()
    # Nobody deletes another's: 404; the owner's delete answers the fragment without it.
    delete = f"/w/{team.slug}/runs/filters/{row.pk}/delete/"
    assert client_for(team.users[other]).post(delete).status_code == 404
    assert client_for(team.users["outsider"]).post(delete).status_code == 404
    gone = client_for(team.users[role]).post(delete, HTTP_HX_REQUEST="true")
    assert gone.status_code == 200 and "data-saved" not in gone.content.decode()
    assert not SavedRunFilter.objects.filter(pk=row.pk).exists()
    assert client_for(team.users[role]).post(delete).status_code == 404  # already gone


@pytest.mark.django_db
def test_saved_filters_take_only_a_members_signed_in_post(team: Team) -> None:
    assert Client().post(f"/w/{team.slug}/runs/filters/", {"name": "x", "agent": "a"}).status_code == 302
    assert client_for(team.users["operator"]).get(f"/w/{team.slug}/runs/filters/").status_code == 405
    assert save(team, "outsider", {"name": "x", "agent": "a"}).status_code == 404
    assert client_for(team.users["operator"]).get(f"/w/{team.slug}/runs/filters/1/delete/").status_code == 405
    huge = f"/w/{team.slug}/runs/filters/{10**30}/delete/"
    assert client_for(team.users["operator"]).post(huge).status_code == 404
    assert not SavedRunFilter.objects.exists()
    # Without htmx a save goes back to the list.
    response = save(team, "viewer", {"name": "mine", "creator": team.users["viewer"].username})
    assert response.status_code == 302 and response["Location"] == f"/w/{team.slug}/runs/"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("form", "key"),
    [
        ({"name": "", "agent": "a"}, "invalid_name"),
        ({"name": "   ", "agent": "a"}, "invalid_name"),
        ({"name": "n" * 81, "agent": "a"}, "invalid_name"),
        ({"name": "nul\x00", "agent": "a"}, "invalid_name"),
        ({"name": "nothing"}, "empty_filter"),
        ({"name": "bad", "run": "zz"}, "invalid_run"),
        ({"name": "bad", "status": "bogus"}, "invalid_status"),
        ({"name": "huge", "agent": "a" * 100_000}, "invalid_agent"),
    ],
)
def test_a_bad_save_is_typed_and_saves_nothing(team: Team, form: dict[str, str], key: str) -> None:
    htmx = save(team, "operator", form, HTTP_HX_REQUEST="true")
    assert htmx.status_code == 200 and f'data-error="{key}"' in htmx.content.decode()
    plain = save(team, "operator", form)
    assert plain.status_code == 400 and f'data-error="{key}"' in plain.content.decode()
    assert not SavedRunFilter.objects.exists()


@pytest.mark.django_db
def test_a_person_keeps_at_most_so_many_filters_per_workspace(team: Team) -> None:
    for number in range(MAX_PER_WORKSPACE):
        assert save(team, "reader", {"name": f"f{number}", "agent": f"a{number}"}).status_code == 302
    refused = save(team, "reader", {"name": "one more", "agent": "x"}, HTTP_HX_REQUEST="true")
    assert 'data-error="too_many_filters"' in refused.content.decode()
    assert save(team, "reader", {"name": "f0", "agent": "replaced"}).status_code == 302  # a known name is replaced
    assert SavedRunFilter.objects.filter(user=team.users["reader"]).count() == MAX_PER_WORKSPACE
    assert save(team, "viewer", {"name": "one more", "agent": "x"}).status_code == 302  # another person's own count


# ---- in the browser ----


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


@pytest.mark.browser
@pytest.mark.live
@pytest.mark.usefixtures("committed")
def test_in_the_browser_a_viewer_searches_saves_applies_and_deletes_a_filter(live_team: Team, browsers: Any) -> None:
    operator = live_team.users["operator"]
    states.agent("lister", live_team.workspace)
    runs = [echo_run(live_team, operator, agent="lister") for _ in range(3)]
    other = echo_run(live_team, operator)
    browser = browsers()
    browser.sign_in(live_team.users["viewer"].username)
    page = browser.open(f"/w/{live_team.slug}/runs/")
    expect(page.locator("#run-rows tr[id^=run-]")).to_have_count(4)

    page.fill(".run-search input[name=run]", str(runs[1].pk)[:8])
    page.click(".run-search button[type=submit]")
    expect(page.locator(f"#run-{runs[1].pk}")).to_be_visible()
    expect(page.locator(f"#run-{other.pk}")).to_have_count(0)

    page.fill(".run-search input[name=run]", "")
    page.fill(".run-search input[name=agent]", "lister")
    page.click(".run-search button[type=submit]")
    expect(page.locator("#run-rows tr[id^=run-]")).to_have_count(3)
    page.fill(".save-filter input[name=name]", "lister runs")
    page.click(".save-filter button[type=submit]")
    expect(page.locator('[data-saved="lister runs"] a')).to_be_visible()
    browser.shot("runs-list-saved-filter")

    page.goto(f"{browser.server.url}/w/{live_team.slug}/runs/")
    expect(page.locator("#run-rows tr[id^=run-]")).to_have_count(4)
    page.click('[data-saved="lister runs"] a')
    expect(page.locator("#run-rows tr[id^=run-]")).to_have_count(3)
    expect(page.locator(".run-search input[name=agent]")).to_have_value("lister")
    page.click('[data-saved="lister runs"] button')
    expect(page.locator("[data-saved]")).to_have_count(0)
    assert not SavedRunFilter.objects.filter(user=live_team.users["viewer"]).exists()
    assert not [e for e in browser.errors if "Content Security Policy" in e or "Refused" in e], browser.errors
