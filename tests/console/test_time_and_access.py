"""Issue 30.8, time and access, on the server's HTML: a per-person time zone (a setting of one's
own; pages render times in it), an absolute time with its zone behind every time a page shows,
the trace's date and zone, a skip link, scroll regions a keyboard reaches, a viewer's and a
reader's pages saying they are read-only, someone else's private run told apart from a role, and
the greens at 4.5:1. (tests/console/test_time_and_access_browser.py runs axe-core and the 390 px
checks in Chromium.)"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest
from django.test import Client

from console.models import PersonSettings
from console.person_settings import SESSION_KEY
from console.templatetags.oz0_console import abs_time, trace_time
from runs import kernel
from runs.models import Run
from tests.conftest import ROOT, Team
from tests.console import states
from tests.factories import make_member

pytestmark = pytest.mark.django_db


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def html(client: Client, url: str, **extra: Any) -> str:
    response = client.get(url, **extra)
    assert response.status_code == 200, (url, response.status_code)
    return response.content.decode()


def pages(team: Team) -> dict[str, str]:
    """Every console page with times on it, over a workspace with something of each kind."""
    agent = states.agent("timer", team.workspace)
    waiting = states.approval_run(team.workspace, team.users["operator"], agent_name=agent)
    held = states.halted_run(team.workspace, team.users["operator"], agent_name=agent)
    kernel.approve(run_id=waiting.pk, key="r1.1", user=team.users["operator"])
    slug = team.slug
    return {
        "inbox": f"/w/{slug}/inbox/",
        "holds": f"/w/{slug}/holds/",
        "runs": f"/w/{slug}/runs/",
        "run": f"/runs/{held.pk}/",
        "waiting run": f"/runs/{waiting.pk}/",
        "audit": f"/w/{slug}/audit/",
        "agents": f"/w/{slug}/agents/",
        "scorecard": f"/w/{slug}/agents/{agent}/",
        "schedules": f"/w/{slug}/schedules/",
        "triggers": f"/w/{slug}/triggers/",
        "tokens": "/tokens/",
        "settings": "/settings/",
        "notifications": "/subscriptions/",
    }


TIME_TAG = re.compile(r"<time\b[^>]*>")
ABSOLUTE = re.compile(r'title="[^"]*\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [A-Z+\-0-9]+[^"]*"')


def test_every_time_a_page_shows_has_its_absolute_time_and_zone_on_hover(team: Team) -> None:
    client = client_for(team.users["operator"])
    client.post("/tokens/", {"label": "a token", "expires_in_days": "30"})
    seen = 0
    urls = pages(team)
    held = Run.objects.filter(workspace=team.workspace, status="needs_attention").get()
    urls["trace"] = f"/runs/{held.pk}/trace/"  # a fragment of the run page
    for name, url in urls.items():
        for tag in TIME_TAG.findall(html(client, url)):
            seen += 1
            assert ABSOLUTE.search(tag), (name, tag)
    assert seen >= 10


def test_pages_render_times_in_the_persons_own_time_zone(team: Team) -> None:
    run = states.halted_run(team.workspace, team.users["operator"])
    kernel.cancel_run(run_id=run.pk, user=team.users["operator"], reason="stop")
    client = client_for(team.users["operator"])
    assert "UTC" in html(client, f"/w/{team.slug}/audit/")
    response = client.post("/settings/", {"time_zone": "Asia/Kolkata"})
    assert response.status_code == 302 and PersonSettings.objects.get(user=team.users["operator"]).time_zone == "Asia/Kolkata"
    audit = html(client, f"/w/{team.slug}/audit/")
    assert "IST" in audit and " UTC</time>" not in audit
    trace = html(client, f"/runs/{run.pk}/trace/")
    # The trace's events carry their date and zone.
    assert re.search(r'class="ev-at[^"]*"[^>]*>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} IST</time>', trace), trace[:3000]
    # Another person's pages stay in theirs (UTC by default).
    assert "IST" not in html(client_for(team.users["reader"]), f"/w/{team.slug}/audit/")
    # A new session reads the setting again.
    assert "IST" in html(client_for(team.users["operator"]), f"/w/{team.slug}/audit/")


def test_the_filters_say_the_zone() -> None:
    moment = datetime(2026, 12, 4, 18, 5, 9, 123456, tzinfo=UTC)
    assert abs_time(moment) == "2026-12-04 18:05:09 UTC"
    assert abs_time(moment.isoformat()) == "2026-12-04 18:05:09 UTC"
    assert trace_time(moment) == "2026-12-04 18:05:09.123 UTC"
    assert abs_time("not a time") == "" and abs_time(None) == ""


BAD_ZONES = [
    ("unknown", {"time_zone": "Mars/Olympus"}),
    ("empty", {"time_zone": ""}),
    ("missing", {}),
    ("huge", {"time_zone": "Europe/" + "x" * 100_000}),
    ("a path", {"time_zone": "../../etc/passwd"}),
]


@pytest.mark.parametrize(("name", "form"), BAD_ZONES, ids=[b[0] for b in BAD_ZONES])
def test_a_bad_time_zone_is_refused_and_changes_nothing(team: Team, name: str, form: dict[str, str]) -> None:
    user = team.users["viewer"]
    PersonSettings.objects.create(user=user, time_zone="Europe/Paris")
    response = client_for(user).post("/settings/", form)
    assert response.status_code == 400 and "Not saved" in response.content.decode()
    assert len(response.content) < 200_000
    assert PersonSettings.objects.get(user=user).time_zone == "Europe/Paris"


@pytest.mark.parametrize("role", ["operator", "reader", "viewer", "outsider"])
def test_everyone_sets_their_own_time_zone_and_only_their_own(team: Team, role: str) -> None:
    user = team.users[role]
    client = client_for(user)
    page = html(client, "/settings/")
    assert 'data-zone="UTC"' in page and 'name="time_zone"' in page
    assert client.post("/settings/", {"time_zone": "America/New_York"}).status_code == 302
    assert PersonSettings.objects.get(user=user).time_zone == "America/New_York"
    assert client.session[SESSION_KEY] == "America/New_York"
    assert 'data-zone="America/New_York"' in html(client, "/settings/")
    assert PersonSettings.objects.count() == 1  # nobody else's changed
    assert client.put("/settings/").status_code == 405


def test_a_signed_out_person_is_sent_to_sign_in(team: Team) -> None:
    for method in ("get", "post"):
        response = getattr(Client(), method)("/settings/")
        assert response.status_code == 302 and "/login/" in response["Location"]
    assert PersonSettings.objects.count() == 0


def test_every_page_has_a_skip_link_to_its_main_content(team: Team) -> None:
    client = client_for(team.users["operator"])
    for name, url in pages(team).items():
        page = html(client, url)
        body = page.split("<body", 1)[1]
        assert re.search(r'^[^>]*>\s*<a class="skip-link" href="#main">', body), name
        assert '<main class="page" id="main" tabindex="-1">' in page, name
    assert '<a class="skip-link" href="#main">' in Client().get("/login/").content.decode()


SCROLLERS = re.compile(
    r'<(\w+) [^>]*class="(?:[^"]* )?(?:args|output|table-wrap|graph-wrap|timeline|model-message)(?: [^"]*)?"[^>]*>'
)


def test_every_scroll_region_is_reachable_by_keyboard_and_named(team: Team) -> None:
    client = client_for(team.users["operator"])
    urls = pages(team)
    from tests.console.test_run_page import worked_run

    run = worked_run(team)
    urls["drawer"] = f"/runs/{run.pk}/tasks/e0/"
    seen = 0
    for name, url in urls.items():
        for match in SCROLLERS.finditer(html(client, url)):
            tag = match.group(0)
            if match.group(1) == "svg":
                continue
            seen += 1
            assert 'tabindex="0"' in tag and re.search(r'aria-label="[^"]+"', tag), (name, tag)
            assert match.group(1) == "ol" or 'role="region"' in tag, (name, tag)  # a name needs a role
    assert seen >= 8


@pytest.mark.parametrize("role", ["viewer", "reader"])
def test_a_viewers_and_a_readers_pages_say_they_are_read_only(team: Team, role: str) -> None:
    client = client_for(team.users[role])
    for name, url in pages(team).items():
        page = html(client, url)
        if name in ("tokens", "settings", "notifications"):
            assert "read-only-note" not in page, name  # no workspace: nothing to say
            continue
        assert f'<p class="read-only-note" role="note" data-role="{role}"><strong>Read-only.</strong>' in page, name
        assert ("runs' words" in page) is (role == "viewer"), name
    operator = client_for(team.users["operator"])
    assert "read-only-note" not in html(operator, f"/w/{team.slug}/inbox/")


@pytest.mark.spec("F11", "F12")
def test_someone_elses_private_run_is_told_apart_from_a_role(team: Team) -> None:
    private = states.approval_run(team.workspace, team.users["operator"], private=True)
    public = states.approval_run(team.workspace, team.users["operator"])
    creator = team.users["operator"].username
    other = client_for(make_member(workspace=team.workspace, role="operator"))
    run_page = html(other, f"/runs/{private.pk}/")
    assert f"This run's words are hidden: this is a private run of {creator}" in run_page
    inbox = html(other, f"/w/{team.slug}/inbox/")
    assert f"are hidden: this is a private run of {creator}" in inbox
    viewer = client_for(team.users["viewer"])
    assert "This run's words are hidden from your role." in html(viewer, f"/runs/{public.pk}/")
    # A viewer of someone else's private run: the run is private, whatever their role.
    assert f"private run of {creator}" in html(viewer, f"/runs/{private.pk}/")
    # Its creator reads it.
    assert "This run's words are hidden" not in html(client_for(team.users["operator"]), f"/runs/{private.pk}/")
    # The inbox API says whose private run hides its words, to no one who may read them.
    status, body = team.api().get(f"/inbox?workspace={team.slug}&kind=approval")
    assert status == 200 and all("private_of" not in item for item in body["items"])
    status, body = team.api("viewer").get(f"/inbox?workspace={team.slug}&kind=approval")
    owners = {item["run"]: item.get("private_of") for item in body["items"]}
    assert owners == {str(private.pk): creator, str(public.pk): None}


def contrast(fg: str, bg: str) -> float:
    def luminance(color: str) -> float:
        channels = [int(color.lstrip("#")[i : i + 2], 16) / 255 for i in (0, 2, 4)]
        linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]

    high, low = sorted((luminance(fg), luminance(bg)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_the_greens_and_the_status_colours_reach_4_5_to_1() -> None:
    css = (ROOT / "static" / "css" / "oz0.css").read_text()
    var = dict(re.findall(r"--([\w-]+): (#[0-9a-fA-F]{6});", css))
    for fg, bg in (
        ("ok", "ok-bg"),
        ("run", "run-bg"),
        ("wait", "wait-bg"),
        ("warn", "warn-bg"),
        ("fail", "fail-bg"),
        ("ask", "ask-bg"),
        ("muted", "bg"),
    ):
        assert contrast(var[fg], var[bg]) >= 4.5, (fg, bg)
    # The Agents overview's "better" and the charts' green series, on a card.
    assert ".change .better { color: var(--ok);" in css and contrast(var["ok"], var["panel"]) >= 4.5
    series = re.search(r"\.series-2 \{ color: (#[0-9a-fA-F]{6}); \}", css)
    assert series and contrast(series.group(1), var["panel"]) >= 4.5
    assert "#2b8a3e" not in css  # 4.37:1 on white


@pytest.mark.spec("F11", "S13")
def test_a_held_private_runs_failure_says_whose_run_hides_it(team: Team, no_dispatch: list[int]) -> None:
    from tests.runs.driver import drive

    body = {
        "tasks": [{"key": "a", "kind": "tool", "tool": "test.fail", "args": {"detail": "secret words"}, "on_failure": "halt"}],
        "private": True,
    }
    run, _ = kernel.create_run(workspace=team.workspace, user=team.users["operator"], body=body)
    assert drive(run).status == "needs_attention"
    other = client_for(make_member(workspace=team.workspace, role="operator"))
    holds = html(other, f"/w/{team.slug}/holds/")
    assert "secret words" not in holds
    assert f"detail hidden: this is a private run of {team.users['operator'].username}" in holds
    # Its creator reads the words.
    assert "secret words" in html(client_for(team.users["operator"]), f"/w/{team.slug}/holds/")
