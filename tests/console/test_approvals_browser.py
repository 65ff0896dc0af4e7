"""Issue 30's approvals in headless Chromium against daphne and a real worker: a call with effects
asks for a second keystroke (or a ticked confirmation) before it is approved, an edited call is
sent with Ctrl+Enter, and toasts leave by themselves."""

from __future__ import annotations

from typing import Any

import pytest

from runs import kernel
from runs.models import Run, Task
from tests.conftest import Team, wait_for
from tests.console.test_browser import expect, no_csp_violations

pytestmark = [pytest.mark.browser, pytest.mark.live, pytest.mark.usefixtures("committed")]


def waiting_call(team: Team, tool: str, args: dict[str, Any]) -> Run:
    body = {
        "tasks": [
            {
                "key": "r1",
                "kind": "round",
                "model": "script",
                "prompt": "go",
                "script": [{"text": "I will record it once.", "tool_calls": [{"tool": tool, "args": args}]}, {"text": "done"}],
                "after": [],
            }
        ],
        "deliverable": "r1",
        "approval": {"mode": "ask"},
    }
    run, _ = kernel.create_run(workspace=team.workspace, user=team.users["operator"], body=body)
    wait_for(lambda: Task.objects.filter(run=run, key="r1.1", status="needs_approval").exists(), message="r1.1 waits")
    return run


@pytest.mark.spec("S10", "S5")
def test_a_call_with_effects_needs_a_second_keystroke(live_team: Team, browsers: Any) -> None:
    run = waiting_call(live_team, "test.effect", {"id": f"browser-{live_team.slug}"})
    operator = browsers()
    operator.sign_in(live_team.users["operator"].username)
    page = operator.open(f"/w/{live_team.slug}/inbox/")
    item = page.locator(f'#inbox-items article[data-run="{run.pk}"]')
    expect(item.locator(".chip.effects")).to_have_text("has effects")
    expect(page).to_have_title(f"(1) Inbox · {live_team.slug} · oz0")

    page.keyboard.press("j")
    page.keyboard.press("a")  # arms: nothing is sent
    expect(item.locator(".confirm-hint")).to_be_visible()
    page.wait_for_timeout(300)  # a stray request would have gone by now; none may
    assert Task.objects.get(run=run, key="r1.1").status == "needs_approval"
    page.keyboard.press("j")  # any other key disarms
    expect(item.locator(".confirm-hint")).to_be_hidden()
    page.keyboard.press("a")
    page.keyboard.press("a")  # armed again, then confirmed: approved
    expect(page.locator('#toasts [data-outcome="ok"]').first).to_contain_text("Approved")
    wait_for(lambda: Task.objects.get(run=run, key="r1.1").status != "needs_approval", message="r1.1 approved")
    # The toast leaves by itself.
    expect(page.locator('#toasts [data-outcome="ok"]')).to_have_count(0, timeout=15_000)
    operator.shot("approve-with-effects")
    no_csp_violations(operator)


def test_an_edited_call_is_sent_with_ctrl_enter_and_runs_with_the_edit(live_team: Team, browsers: Any) -> None:
    run = waiting_call(live_team, "test.echo", {"value": "before"})
    operator = browsers()
    operator.sign_in(live_team.users["operator"].username)
    page = operator.open(f"/w/{live_team.slug}/inbox/")
    item = page.locator(f'#inbox-items article[data-run="{run.pk}"]')
    expect(item.locator(".model-message")).to_contain_text("I will record it once.")
    item.locator("details.edit summary").click()
    editor = item.locator("textarea[name=args]")
    editor.fill('{"value": "after"}')
    editor.press("Control+Enter")
    expect(page.locator('#toasts [data-outcome="ok"]').first).to_contain_text("Approved as edited")
    wait_for(lambda: Run.objects.get(pk=run.pk).status == "completed", timeout=30, message="the run completed")
    assert Task.objects.get(run=run, key="r1.1").result["value"] == "after"
    no_csp_violations(operator)
