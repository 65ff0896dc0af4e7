"""Issue 30.8 in headless Chromium against daphne and a real worker: axe-core (vendored from the
npm registry, `static/vendor/axe/`) on every console page, as an operator and as a viewer, with
no serious or critical violation; at 390 px the audit filters wrap, Repair many starts collapsed
and the child-runs table scrolls inside its region; the skip link is the first stop of the
keyboard; a relative time shows its absolute time in the person's zone on hover."""

from __future__ import annotations

from typing import Any

import pytest

from console.models import PersonSettings
from insights.models import FailureGroup
from runs import kernel
from runs.models import Run
from tests.browser import Browser, ConsoleServer
from tests.conftest import Team, wait_for
from tests.console.test_browser import expect, halted, waiting_for_approval
from tests.console.test_rough_edges_browser import AxeBrowser, question_run
from tests.delegation.tree import agent as register_agent

pytestmark = [pytest.mark.browser, pytest.mark.live, pytest.mark.usefixtures("committed")]


def family(team: Team) -> Run:
    """A parent whose delegate's child run gave up: the parent's page lists its child runs."""
    helper = register_agent(
        team.workspace,
        "model: script\ntools: [oz.fail]\nfailures:\n  - kind: gave_up\n    description: Gave up\n"
        "approval: {mode: bypass}\nscript:\n  - oz_fail: {kind: gave_up, message: 'no'}\n",
    )
    parent, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={"tasks": [{"key": "d", "kind": "delegate", "agent": helper, "on_failure": "halt"}]},
    )
    wait_for(lambda: Run.objects.filter(parent=parent).exists(), message="the child run started")
    return parent


def every_page(team: Team) -> dict[str, str]:
    from tests.console import states

    states.agent("axe-bot", team.workspace)
    waiting = waiting_for_approval(team)
    held = halted(team, flaky=False, agent_name="axe-bot", detail="disk full")
    question_run(team)
    parent = family(team)
    client_await, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={"tasks": [{"key": "confirm", "kind": "await", "question": "Ship?"}]},
    )
    done = halted(team, flaky=False, agent_name="axe-bot", detail="disk full again")
    kernel.cancel_run(run_id=done.pk, user=team.users["operator"], reason="give up")
    slug = team.slug
    pages = {
        "home": "/",
        "workspace": f"/w/{slug}/",
        "inbox": f"/w/{slug}/inbox/",
        "inbox client awaits": f"/w/{slug}/inbox/?kind=client_await",
        "approve many": f"/w/{slug}/inbox/approve-many/?run={waiting.pk}&task=r1.1",
        "holds": f"/w/{slug}/holds/",
        "runs": f"/w/{slug}/runs/",
        "run waiting": f"/runs/{waiting.pk}/",
        "run held": f"/runs/{held.pk}/",
        "run with children": f"/runs/{parent.pk}/",
        "run with a client await": f"/runs/{client_await.pk}/",
        "task drawer": f"/runs/{held.pk}/tasks/a/",
        "audit": f"/w/{slug}/audit/",
        "agents": f"/w/{slug}/agents/",
        "scorecard": f"/w/{slug}/agents/axe-bot/",
        "search": f"/w/{slug}/agents/axe-bot/?q=finding%3Atool_failed",
        "schedules": f"/w/{slug}/schedules/",
        "triggers": f"/w/{slug}/triggers/",
        "workspace settings": f"/w/{slug}/settings/",
        "tokens": "/tokens/",
        "notifications": "/subscriptions/",
        "your settings": "/settings/",
    }
    group = FailureGroup.objects.filter(workspace_id=team.workspace.pk).first()
    if group is not None:
        pages["failure group"] = f"/w/{slug}/groups/{group.pk}/"
    return pages


def axe_report(browser: AxeBrowser, server: ConsoleServer, pages: dict[str, str], who: str) -> list[str]:
    report = []
    for name, path in pages.items():
        response = browser.page.goto(f"{server.url}{path}")
        # An operator reads every page; a viewer may be refused one (403), with an accessible page too.
        allowed = (200,) if who == "operator" else (200, 403)
        assert response is not None and response.status in allowed, (who, name, response and response.status)
        browser.page.wait_for_load_state("networkidle")
        for violation in browser.violations():
            for node in violation["nodes"]:
                report.append(f"{who} {name}: {violation['impact']} {violation['id']} ({violation['help']}) at {node}")
    return report


@pytest.mark.thorough
@pytest.mark.spec("S5")
def test_axe_finds_nothing_serious_or_critical_on_every_console_page(
    live_team: Team, chromium: Any, console_server: ConsoleServer
) -> None:
    pages = every_page(live_team)
    report: list[str] = []
    for role in ("operator", "viewer"):
        browser = AxeBrowser(chromium, console_server)
        try:
            if role == "operator":
                browser.page.goto(f"{console_server.url}/login/")
                report += [f"login: {v['impact']} {v['id']}" for v in browser.violations()]
            browser.sign_in(live_team.users[role].username)
            shown = {k: v for k, v in pages.items() if role == "operator" or k not in ("approve many", "workspace settings")}
            report += axe_report(browser, console_server, shown, role)
        finally:
            browser.close()
    assert not report, "\n".join(report)


def test_at_390_px_the_filters_wrap_repair_many_is_collapsed_and_wide_tables_scroll(live_team: Team, browsers: Any) -> None:
    halted(live_team, flaky=False, detail="disk full")
    parent = family(live_team)
    phone: Browser = browsers(phone=True)
    phone.sign_in(live_team.users["operator"].username)
    fits = "document.documentElement.scrollWidth <= window.innerWidth"

    page = phone.open(f"/w/{live_team.slug}/audit/")
    assert page.evaluate(fits), "the audit page scrolls sideways"
    form = page.locator("#audit-filter")
    assert form.evaluate("f => f.scrollWidth <= f.clientWidth"), "the audit filters overflow"
    labels = form.locator("label")
    tops = {round(labels.nth(i).bounding_box()["y"]) for i in range(labels.count())}
    assert len(tops) > 1, "the audit filters stay on one line"

    page = phone.open(f"/w/{live_team.slug}/holds/")
    panel = page.locator("details.bulk-panel")
    expect(panel).to_have_count(1)
    assert panel.evaluate("d => d.open") is False, "Repair many starts open on a phone"
    page.locator("details.bulk-panel > summary").click()
    assert panel.evaluate("d => d.open") is True
    assert page.evaluate(fits)

    page = phone.open(f"/runs/{parent.pk}/")
    wrap = page.locator("#run-family .table-wrap")
    expect(wrap).to_have_count(1)
    assert page.evaluate(fits), "the run page scrolls sideways"
    assert wrap.evaluate("w => w.scrollWidth > w.clientWidth && getComputedStyle(w).overflowX === 'auto'")
    assert wrap.get_attribute("tabindex") == "0" and wrap.get_attribute("aria-label") == "child runs table"
    phone.shot("child-runs-390")

    # On a wide screen Repair many opens by itself.
    wide: Browser = browsers()
    wide.sign_in(live_team.users["operator"].username)
    page = wide.open(f"/w/{live_team.slug}/holds/")
    assert page.locator("details.bulk-panel").evaluate("d => d.open") is True


def test_the_skip_link_is_the_first_stop_and_times_show_in_the_persons_zone(live_team: Team, browsers: Any) -> None:
    run = halted(live_team, flaky=False, detail="disk full")
    viewer = live_team.users["viewer"]
    PersonSettings.objects.create(user=viewer, time_zone="Asia/Tokyo")
    browser: Browser = browsers()
    browser.sign_in(viewer.username)
    page = browser.open(f"/runs/{run.pk}/")
    page.keyboard.press("Tab")
    skip = page.locator("a.skip-link")
    expect(skip).to_be_focused()
    expect(skip).to_be_visible()
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"
    expect(page.locator("p.read-only-note")).to_contain_text("Read-only.")
    started = page.locator(".run-meta time").first
    assert (started.get_attribute("title") or "").endswith(" JST")
    expect(page.locator("#trace-rows time.ev-at").first).to_contain_text("JST")
    # A scroll region takes the keyboard's focus.
    region = page.locator("#trace-rows")
    region.focus()
    expect(region).to_be_focused()
