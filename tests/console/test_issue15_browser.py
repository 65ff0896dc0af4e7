"""Issue 15 in Chromium, against daphne and a real worker: a bulk retry of 50 holds while a second
operator retries some of them through the API (every run retried exactly once), and an approval
refused because the call changed after the page showed it (then the new call shown and approved)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, transaction

from runs.kernel import call_digest
from runs.models import Run, Task, TraceEvent
from tests.conftest import Api, Team, wait_for
from tests.console import states
from tests.console.bulk_holds import verb_events
from tests.console.test_browser import no_csp_violations, waiting_for_approval
from tests.console.test_bulk_repair import flaky_held
from tests.factories import make_member, make_token

# Committed data (no rollback, no flush), so the worker and daphne see every row.
pytestmark = [pytest.mark.browser, pytest.mark.live, pytest.mark.usefixtures("committed")]

HELD = 50
TAKEN_BY_B = 15


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


@pytest.mark.spec("S14")
@pytest.mark.spec("S15")
def test_it_bulk_retries_50_holds_in_the_browser_while_a_second_operator_retries_some(live_team: Team, browsers: Any) -> None:
    agent = states.agent("bulk-fifty", live_team.workspace)
    runs = [flaky_held(live_team, agent) for _ in range(HELD)]
    wait_for(
        lambda: Run.objects.filter(pk__in=[r.pk for r in runs], status="needs_attention").count() == HELD,
        timeout=180,
        message=f"{HELD} runs held",
    )
    second = make_member(workspace=live_team.workspace, role="operator")
    api_b = Api(make_token(user=second))

    operator = browsers()
    operator.sign_in(live_team.users["operator"].username)
    page = operator.open(f"/w/{live_team.slug}/holds/")
    page.fill('#bulk-form input[name="agent"]', agent)
    page.select_option('#bulk-form select[name="kind"]', "tool_failed")
    page.click('button[data-bulk-preview="retry"]')
    sentence = f"Retry {HELD} held runs of agent {agent}, kind tool_failed"
    expect(page.locator(".bulk-sentence")).to_have_text(sentence)
    ids = [box.get_attribute("value") for box in page.locator('#bulk-confirm input[name="runs"]').all()]
    assert sorted(ids) == sorted(str(r.pk) for r in runs)

    # Operator B retries the last fifteen, from the end, through the API while A's chunks run
    # from the start: whoever takes a run's lock first repairs it, the other is told.
    b_answers: dict[str, int] = {}

    def operator_b() -> None:
        try:
            for run_id in reversed(ids[-TAKEN_BY_B:]):
                status, _ = api_b.post(f"/runs/{run_id}/tasks/a/retry")
                b_answers[str(run_id)] = status
        finally:
            connection.close()

    thread = threading.Thread(target=operator_b)
    thread.start()
    page.click('button[data-bulk-confirm="retry"]')  # the confirm dialog is accepted
    try:
        expect(page.locator("#bulk-progress")).to_have_text(f"Finished: {HELD} of {HELD} runs done.", timeout=90_000)
    finally:
        thread.join(timeout=60)
    assert not thread.is_alive()
    operator.shot("issue15-bulk-fifty-raced")

    taken_by_b = {run_id for run_id, status in b_answers.items() if status == 200}
    assert len(b_answers) == TAKEN_BY_B and set(b_answers.values()) <= {200, 409}, b_answers
    assert taken_by_b, f"operator B repaired none of its runs: {b_answers}"
    rows = page.locator("#bulk-rows [data-outcome]")
    expect(rows).to_have_count(HELD)
    outcomes = {row.get_attribute("data-run"): row.get_attribute("data-outcome") for row in rows.all()}
    assert set(outcomes) == set(ids)
    assert {run for run, outcome in outcomes.items() if outcome == "skipped"} == taken_by_b
    assert {run for run, outcome in outcomes.items() if outcome == "retried"} == set(ids) - taken_by_b
    for run_id in taken_by_b:
        row = page.locator(f'#bulk-rows [data-run="{run_id}"]')
        expect(row.locator("[data-reason]")).to_have_attribute("data-reason", "not_held")
        expect(row).to_contain_text(f"retried by {second.username}")

    wait_for(
        lambda: Run.objects.filter(pk__in=[r.pk for r in runs], status="completed").count() == HELD,
        timeout=120,
        message=f"all {HELD} completed",
    )
    for run in runs:
        assert verb_events(run, "retry") == {"a": 1}, (run.pk, verb_events(run, "retry"))
        [event] = [e for e in TraceEvent.objects.filter(run=run, event="verb") if (e.data or {}).get("verb") == "retry"]
        expected = second.username if str(run.pk) in taken_by_b else live_team.users["operator"].username
        assert event.actor == expected, (run.pk, event.actor)
    no_csp_violations(operator)
    assert not [e for e in operator.errors if "Refused" in e], operator.errors


def reauthor(run: Run, key: str, args: dict[str, Any]) -> None:
    """Re-author a waiting call's arguments under the run's row lock, as every writer does
    (tests/runs/test_approval_binding.py); nothing is broadcast, so the page still shows the old."""
    with transaction.atomic():
        Run.objects.select_for_update().get(pk=run.pk)
        call = Task.objects.get(run=run, key=key)
        Task.objects.filter(pk=call.pk).update(spec={**call.spec, "args": args})


@pytest.mark.spec("S5")
@pytest.mark.spec("S6")
def test_it_refuses_an_approval_whose_call_changed_since_the_page_showed_it(live_team: Team, browsers: Any) -> None:
    run = waiting_for_approval(live_team)
    operator = browsers()
    operator.sign_in(live_team.users["operator"].username)
    page = operator.open(f"/w/{live_team.slug}/inbox/")
    item = page.locator('article[data-task="r1.1"]')
    expect(item.locator("pre.args")).to_contain_text("ship the <b>release</b>")
    shown = call_digest("test.echo", {"value": 1, "note": "ship the <b>release</b>"})
    expect(item.locator('form:has(button[data-verb="approve"]) input[name="digest"]')).to_have_value(shown)

    new_args = {"value": 2, "note": "ship the <i>other</i> release"}
    reauthor(run, "r1.1", new_args)
    expect(item.locator("pre.args")).to_contain_text("ship the <b>release</b>")  # the page still shows the old call
    item.locator('button[data-verb="approve"]').click()
    refusal = page.locator('#toasts [data-outcome="refused"]')
    expect(refusal).to_contain_text("The call changed")
    operator.shot("issue15-approval-call-changed")

    call = Task.objects.get(run=run, key="r1.1")
    assert call.status == "needs_approval" and call.approved_digest is None and call.result is None
    assert not TraceEvent.objects.filter(run=run, task_key="r1.1", event="verb").exists()
    assert not TraceEvent.objects.filter(run=run, task_key="r1.1", event="status", to_status="running").exists()

    # The refusal refreshes the page's live fragments: the new arguments, and their digest, are shown.
    expect(item.locator("pre.args")).to_contain_text("ship the <i>other</i> release", timeout=10_000)
    expect(item.locator('form:has(button[data-verb="approve"]) input[name="digest"]')).to_have_value(
        call_digest("test.echo", new_args)
    )
    item.locator('button[data-verb="approve"]').click()
    expect(page.locator('#toasts [data-outcome="ok"]')).to_contain_text("Approved")
    wait_for(lambda: Run.objects.get(pk=run.pk).status == "completed", message="the run completed")
    call = Task.objects.get(run=run, key="r1.1")
    assert call.approved_digest == call_digest("test.echo", new_args) and call.result["value"] == 2
    operator.shot("issue15-approval-new-args-approved")
    no_csp_violations(operator)
