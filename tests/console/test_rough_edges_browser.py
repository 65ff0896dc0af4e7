"""Issue 15's console rough edges in headless Chromium against daphne and a real worker: the inbox
by keyboard, a live refresh that keeps what a person loaded, and a refused POST told as a toast.
axe-core on every console page is test_time_and_access_browser.py's, with the browser it uses here."""

from __future__ import annotations

from typing import Any

import pytest

from runs import kernel
from runs.models import Run, Task
from tenancy.models import Membership
from tests.browser import Browser, ConsoleServer
from tests.conftest import ROOT, Team, wait_for
from tests.console.test_browser import ROUND_WITH_ONE_CALL, expect, no_csp_violations, waiting_for_approval

pytestmark = [pytest.mark.browser, pytest.mark.live, pytest.mark.usefixtures("committed")]

# Vendored from the npm registry (`npm pack axe-core`); injected here only, never served to a page.
AXE = ROOT / "static" / "vendor" / "axe" / "axe-4.14.1.min.js"
BLOCKING = ("serious", "critical")
RUN_AXE = """async () => {
  const result = await axe.run(document, {resultTypes: ["violations"]});
  return result.violations.map(v => ({
    id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.slice(0, 5).map(n => n.target.join(" ") + " :: " + (n.failureSummary || "").slice(0, 300)),
  }));
}"""


class AxeBrowser(Browser):
    """A browser whose pages take the injected axe script: the page's CSP (script-src 'self')
    would refuse an injected script, so this context alone bypasses it; the pages are the same."""

    def __init__(self, chromium: Any, server: ConsoleServer) -> None:
        self.context = chromium.new_context(viewport={"width": 1280, "height": 860}, bypass_csp=True)
        self.page = self.context.new_page()
        self.server = server
        self.errors: list[str] = []
        self.page.on("dialog", lambda dialog: dialog.accept())

    def violations(self) -> list[dict[str, Any]]:
        self.page.add_script_tag(path=str(AXE))
        found: list[dict[str, Any]] = self.page.evaluate(RUN_AXE)
        return [v for v in found if v["impact"] in BLOCKING]


def question_run(team: Team) -> Run:
    body = {
        "tasks": [
            {
                "key": "q1",
                "kind": "round",
                "model": "script",
                "prompt": "go",
                "script": [{"ask": "Which region?"}, {"text": "ok"}],
                "after": [],
            }
        ]
    }
    run, _ = kernel.create_run(workspace=team.workspace, user=team.users["operator"], body=body)
    wait_for(lambda: Task.objects.filter(run=run, status="awaiting_input").exists(), message="the question asked")
    return run


def test_it_drives_the_inbox_by_keyboard(live_team: Team, browsers: Any) -> None:
    first = waiting_for_approval(live_team)
    second = waiting_for_approval(live_team)
    asked = question_run(live_team)
    operator = browsers()
    operator.sign_in(live_team.users["operator"].username)
    page = operator.open(f"/w/{live_team.slug}/inbox/")
    expect(page.locator("#inbox-keys")).to_be_visible()
    items = page.locator("#inbox-items article.item")
    expect(items).to_have_count(3)

    page.keyboard.press("j")
    expect(items.nth(0)).to_have_class(lambda_class("is-current"))
    assert page.evaluate("document.activeElement.id") == items.nth(0).get_attribute("id")
    assert page.evaluate("getComputedStyle(document.activeElement).outlineStyle") != "none"  # the focus shows
    page.keyboard.press("j")
    expect(items.nth(1)).to_have_class(lambda_class("is-current"))
    page.keyboard.press("k")
    expect(items.nth(0)).to_have_class(lambda_class("is-current"))

    # d opens deny with its reason focused; keys typed there are the field's (no "a"pprove).
    page.keyboard.press("d")
    reason = items.nth(0).locator("input[name=reason]")
    expect(reason).to_be_focused()
    page.keyboard.type("a day too early")
    expect(reason).to_have_value("a day too early")
    assert Task.objects.get(run=first, key="r1.1").status == "needs_approval"
    page.keyboard.press("Escape")
    expect(items.nth(0)).to_be_focused()

    # a approves the current item; the live refresh keeps a current item in its place.
    page.keyboard.press("a")
    expect(page.locator('#toasts [data-outcome="ok"]').first).to_contain_text("Approved")
    wait_for(lambda: Task.objects.get(run=first, key="r1.1").status != "needs_approval", message="r1.1 approved")
    expect(page.locator(f'#inbox-items article[data-run="{first.pk}"]')).to_have_count(0, timeout=15_000)
    expect(page.locator("#inbox-items article.item.is-current")).to_have_count(1)

    # r focuses the question's answer.
    question = page.locator(f'#inbox-items article[data-run="{asked.pk}"]')
    for _ in range(3):
        if "is-current" in (question.get_attribute("class") or ""):
            break
        page.keyboard.press("j")
    page.keyboard.press("r")
    expect(question.locator("textarea[name=value]")).to_be_focused()
    page.keyboard.type("eu-west")
    page.keyboard.press("Escape")
    assert Task.objects.get(run=second, key="r1.1").status == "needs_approval"
    operator.shot("inbox-keyboard")
    no_csp_violations(operator)


def lambda_class(name: str) -> Any:
    import re

    return re.compile(rf"(^|\s){name}(\s|$)")


def test_it_keeps_the_loaded_items_through_a_live_refresh(live_team: Team, browsers: Any) -> None:
    runs = [
        kernel.create_run(workspace=live_team.workspace, user=live_team.users["operator"], body=ROUND_WITH_ONE_CALL)[0]
        for _ in range(27)
    ]
    wait_for(
        lambda: Task.objects.filter(run__in=runs, key="r1.1", status="needs_approval").count() == 27,
        timeout=90,
        message="27 calls waiting for approval",
    )
    operator = browsers()
    operator.sign_in(live_team.users["operator"].username)
    page = operator.open(f"/w/{live_team.slug}/inbox/")
    items = page.locator("#inbox-items article.item")
    expect(items).to_have_count(25)
    page.click("#inbox-items .load-more button")
    expect(items).to_have_count(27)
    expect(page.locator("#inbox-items .load-more")).to_have_count(0)
    # Someone else approves one: the live refresh shows the other 26, not the first page of 25.
    kernel.approve(run_id=runs[3].pk, key="r1.1", user=live_team.users["operator"])
    expect(page.locator(f'#inbox-items article[data-run="{runs[3].pk}"]')).to_have_count(0, timeout=15_000)
    expect(items).to_have_count(26)
    no_csp_violations(operator)


def test_it_tells_a_refused_post_as_a_toast(live_team: Team, browsers: Any) -> None:
    run = waiting_for_approval(live_team)
    operator = browsers()
    user = live_team.users["operator"]
    operator.sign_in(user.username)
    page = operator.open(f"/w/{live_team.slug}/inbox/")
    expect(page.locator('article[data-task="r1.1"]')).to_be_visible()
    # The person's role is lowered while the page is open: the click is refused (403) and says why.
    Membership.objects.filter(workspace=live_team.workspace, user=user).update(role="viewer")
    page.click(f'article[data-run="{run.pk}"] button[data-verb="approve"]')
    toast = page.locator('#toasts [data-outcome="refused"]').first
    expect(toast).to_contain_text("Not allowed")
    expect(toast).to_contain_text("operator")
    assert Task.objects.get(run=run, key="r1.1").status == "needs_approval"
    # Out of the workspace altogether: a 404 toast that names nothing.
    Membership.objects.filter(workspace=live_team.workspace, user=user).delete()
    page.click(f'article[data-run="{run.pk}"] button[data-verb="approve"]')
    expect(page.locator('#toasts [data-outcome="refused"]').first).to_contain_text("Not found")
    assert Task.objects.get(run=run, key="r1.1").status == "needs_approval"
    no_csp_violations(operator)
