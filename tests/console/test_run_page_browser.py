"""The run page in headless Chromium against daphne and a real worker (issue 30): the fan-out's
group, the task table's pages and status filter, the task drawer, and the trace's older page and
filter, each swapped in place by htmx under the console's CSP."""

from __future__ import annotations

from typing import Any

import pytest

from runs import kernel
from runs.models import Task, TraceEvent
from runs.run_page import TRACE_PAGE
from tests.conftest import Team, wait_for
from tests.console.test_browser import expect, no_csp_violations

pytestmark = [pytest.mark.browser, pytest.mark.live, pytest.mark.usefixtures("committed")]


def test_it_reads_a_fan_out_run_page_by_page_and_task_by_task(live_team: Team, browsers: Any) -> None:
    echoes = [
        {"key": f"e{i}", "kind": "tool", "tool": "test.echo", "args": {"value": f"echo {i}"}, "after": []} for i in range(60)
    ]
    gate = {"key": "gate", "kind": "await", "question": "held open", "after": []}
    run, _ = kernel.create_run(workspace=live_team.workspace, user=live_team.users["operator"], body={"tasks": [*echoes, gate]})
    wait_for(lambda: Task.objects.filter(run=run, status="completed").count() == 60, message="the 60 echoes done")
    assert TraceEvent.objects.filter(run=run).count() > TRACE_PAGE
    operator = browsers()
    operator.sign_in(live_team.users["operator"].username)
    page = operator.open(f"/runs/{run.pk}/")
    page.evaluate("window.oz0Marker = 'same page'")

    expect(page.locator('tr.group[data-group="e*0"]')).to_contain_text("completed 60")
    expect(page.locator("table.tasks tbody tr")).to_have_count(50)
    page.click("nav.pager a[rel=next]")
    expect(page.locator("table.tasks tbody tr")).to_have_count(11)  # e50…e59 and the gate
    expect(page.locator("table.tasks tbody tr").first).to_have_attribute("data-task", "e50")
    gate_status = Task.objects.get(run=run, key="gate").status  # a client's await: handed out, not waiting
    page.click(f'a[data-status-filter="{gate_status}"]')
    expect(page.locator("table.tasks tbody tr")).to_have_count(1)
    expect(page.locator("table.tasks tbody tr")).to_have_attribute("data-task", "gate")

    page.click('tr.group[data-group="e*0"] a')
    page.click('tr[data-task="e7"] a.key')
    drawer = page.locator("#task-drawer")
    expect(drawer.locator("#drawer-arguments")).to_contain_text("echo 7")
    expect(drawer.locator("#drawer-result")).to_contain_text("echo 7")
    expect(drawer.locator("#drawer-history li")).not_to_have_count(0)
    page.click("#task-drawer .drawer-close")
    expect(drawer.locator(".drawer-body")).to_have_count(0)

    before = page.locator("#trace-rows li").count()
    assert before == TRACE_PAGE
    page.click("#trace-older button")
    total = TraceEvent.objects.filter(run=run).count()
    expect(page.locator("#trace-rows li")).to_have_count(min(total, 2 * TRACE_PAGE))
    page.fill(".trace-filter input[name=task]", "e3")
    page.click(".trace-filter button[type=submit]")
    e3 = TraceEvent.objects.filter(run=run, task_key="e3").count()
    expect(page.locator("#trace-rows li")).to_have_count(e3)
    expect(page.locator("#trace-rows a.key")).to_have_text(["e3"] * e3)

    kernel.pause_run(run_id=run.pk, user=live_team.users["operator"])
    expect(page.locator("#run-status")).to_have_text("paused")
    expect(page.locator("#trace-rows li")).to_have_count(e3)  # the filter holds through the live refresh
    assert page.evaluate("window.oz0Marker") == "same page"
    operator.shot("run-page-fan-out")
    no_csp_violations(operator)
