"""Approvers in the console (issue 31 item 4): the Settings section where operators make approver
groups and set the wait deadlines, and the inbox that shows whose each wait is, whether it is due
or overdue, and no buttons to someone it does not belong to."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from runs import kernel
from runs.models import Run, Task
from tenancy.models import ApproverGroup, Workspace
from tests.conftest import Team
from tests.console import states
from tests.factories import make_member

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


def browser(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def payer(team: Team) -> Any:
    """An operator in the finance group, which owns `test.effect*` calls."""
    member = make_member(workspace=team.workspace, role="operator")
    finance = ApproverGroup.objects.create(workspace=team.workspace, name="finance", tools=["test.effect*"])
    finance.members.set([member])
    return member


def payment(team: Team, **kwargs: Any) -> Run:
    return states.approval_run(team.workspace, team.users["operator"], tool="test.effect", args={"amount": 5}, **kwargs)


def waited(run: Run, seconds: int) -> None:
    """The call parked `seconds` ago (its park clock and its start moved back together)."""
    park = timedelta(seconds=float(settings.OZ0_APPROVAL_PARK_SECONDS))
    start = timezone.now() - timedelta(seconds=seconds)
    Task.objects.filter(run=run, key="r1.1").update(queued_at=start, deadline_at=start + park)


def card(page: str, run: Run) -> str:
    """The inbox card of the run's call."""
    start = page.index(f'data-run="{run.pk}"')
    return page[start : page.index("</article>", start)]


# ---- the inbox ----


@pytest.mark.spec("S5")
def test_the_inbox_shows_a_call_as_the_groups_and_not_actionable_to_an_operator_outside_it(team: Team, payer: Any) -> None:
    run = payment(team)
    outsider_card = card(browser(team.users["operator"]).get(f"/w/{team.slug}/inbox/").content.decode(), run)
    assert "Whose:" in outsider_card and "group finance" in outsider_card and payer.username in outsider_card
    assert "Not yours to decide" in outsider_card and 'data-verb="approve"' not in outsider_card
    assert "chip yours" not in outsider_card
    member_card = card(browser(payer).get(f"/w/{team.slug}/inbox/").content.decode(), run)
    assert 'data-verb="approve"' in member_card and "chip yours" in member_card and "Not yours" not in member_card


@pytest.mark.spec("S5")
@pytest.mark.parametrize("role", ["viewer", "reader", "operator"])
def test_the_inbox_api_tells_every_role_whose_a_wait_is(team: Team, payer: Any, role: str) -> None:
    run = payment(team)
    states.question_run(team.workspace, team.users["operator"])
    status, page = team.api(role).get(f"/inbox?workspace={team.slug}")
    assert status == 200
    items = {item["kind"]: item for item in page["items"]}
    approval, question = items["approval"], items["question"]
    assert approval["run"] == str(run.pk)
    assert approval["owners"] == ["group finance"] and approval["owner_members"] == [payer.username]
    assert approval["yours"] is False and approval["actionable"] is False
    assert approval.get("not_yours") is (True if role == "operator" else None)
    assert question["owners"] == ["operators"] and question["yours"] is (role == "operator")
    assert approval["due"] is None and approval["due_at"] and approval["overdue_at"]
    assert team.api("outsider").get(f"/inbox?workspace={team.slug}")[1]["items"] == []


def test_the_inbox_shows_due_and_overdue_waits(team: Team, payer: Any) -> None:
    Workspace.objects.filter(pk=team.workspace.pk).update(reminder_seconds=600, escalation_seconds=1800)
    fresh, due, overdue = payment(team), payment(team), payment(team)
    waited(due, 900)
    waited(overdue, 3600)
    items = {i["run"]: i for i in team.api("operator").get(f"/inbox?workspace={team.slug}&kind=approval")[1]["items"]}
    assert [items[str(r.pk)]["due"] for r in (fresh, due, overdue)] == [None, "due", "overdue"]
    page = browser(payer).get(f"/w/{team.slug}/inbox/").content.decode()
    assert "chip deadline" not in card(page, fresh)
    assert ">due</span>" in card(page, due) and ">overdue</span>" in card(page, overdue)
    Workspace.objects.filter(pk=team.workspace.pk).update(reminder_seconds=0, escalation_seconds=0)
    items = team.api("operator").get(f"/inbox?workspace={team.slug}&kind=approval")[1]["items"]
    assert {i["due"] for i in items} == {None} and {i["due_at"] for i in items} == {None}


@pytest.mark.spec("S5", "S6")
def test_a_two_approver_call_says_who_approved_and_waits_for_someone_else(team: Team, payer: Any) -> None:
    ApproverGroup.objects.filter(workspace=team.workspace, name="finance").update(two_approvers=True)
    second = make_member(workspace=team.workspace, role="operator")
    ApproverGroup.objects.get(workspace=team.workspace, name="finance").members.add(second)
    run = payment(team)
    answer = browser(payer).post(f"/runs/{run.pk}/tasks/r1.1/approve/", {"confirm_effects": "1"}, **HTMX)
    assert answer.status_code == 200 and "First approval recorded" in answer.content.decode()
    first = card(browser(payer).get(f"/w/{team.slug}/inbox/").content.decode(), run)
    assert "You approved it" in first and 'data-verb="approve"' not in first
    other = card(browser(second).get(f"/w/{team.slug}/inbox/").content.decode(), run)
    assert f"approved by {payer.username}, one more to go" in other and 'data-verb="approve"' in other
    again = browser(payer).post(f"/runs/{run.pk}/tasks/r1.1/approve/", {"confirm_effects": "1"}, **HTMX)
    assert "Needs another approver" in again.content.decode()
    browser(second).post(f"/runs/{run.pk}/tasks/r1.1/approve/", {"confirm_effects": "1"}, **HTMX)
    assert Task.objects.get(run=run, key="r1.1").status != "needs_approval"


def test_the_console_refuses_an_outsiders_approval_as_not_theirs(team: Team, payer: Any) -> None:
    run = payment(team)
    answer = browser(team.users["operator"]).post(f"/runs/{run.pk}/tasks/r1.1/approve/", {"confirm_effects": "1"}, **HTMX)
    assert "Not yours to decide" in answer.content.decode()
    assert Task.objects.get(run=run, key="r1.1").status == "needs_approval"


def test_approve_many_in_the_console_leaves_out_calls_that_are_not_yours(team: Team, payer: Any) -> None:
    run = payment(team)
    preview = browser(team.users["operator"]).get(f"/w/{team.slug}/inbox/approve-many/?run={run.pk}&task=r1.1")
    assert "no longer waits for approval" in preview.content.decode()
    mine = browser(payer).get(f"/w/{team.slug}/inbox/approve-many/?run={run.pk}&task=r1.1").content.decode()
    assert str(run.pk)[:8] in mine


# ---- the Settings section ----


def approvers_section(page: str) -> str:
    start = page.index('<section id="approvers"')
    return page[start : page.index("</section>", start)]


def test_an_operator_sees_the_section_with_the_operators_and_the_deadlines_in_force(team: Team) -> None:
    page = browser(team.users["operator"]).get(f"/w/{team.slug}/settings/").content.decode()
    section = approvers_section(page)
    assert "No approver groups" in section
    # Only operators decide calls: the form offers no one else as a member.
    assert f'value="{team.users["operator"].username}"' in section
    assert f'value="{team.users["reader"].username}"' not in section
    assert f'value="{team.users["viewer"].username}"' not in section
    assert "In force: reminder after 1h 00m, escalation after 4h 00m" in page


@pytest.mark.parametrize("role,expected", [("outsider", 404), ("viewer", 403), ("reader", 403)])
def test_no_one_but_an_operator_changes_groups_or_deadlines(team: Team, role: str, expected: int) -> None:
    client = browser(team.users[role])
    form = {"name": "finance", "tools": "payments.*", "members": [team.users["reader"].username]}
    assert client.post(f"/w/{team.slug}/settings/approvers/", form).status_code == expected
    assert not ApproverGroup.objects.filter(workspace=team.workspace).exists()
    row = ApproverGroup.objects.create(workspace=team.workspace, name="keep", tools=["keep.*"])
    assert client.post(f"/w/{team.slug}/settings/approvers/{row.pk}/delete/").status_code == expected
    assert client.post(f"/w/{team.slug}/settings/deadlines/", {"reminder_minutes": "5"}).status_code == expected
    assert ApproverGroup.objects.filter(pk=row.pk).exists()
    assert Workspace.objects.get(pk=team.workspace.pk).reminder_seconds is None


def test_an_operator_makes_changes_and_deletes_a_group_with_htmx(team: Team) -> None:
    client = browser(team.users["operator"])
    first, operator = make_member(workspace=team.workspace, role="operator").username, team.users["operator"].username
    form = {"name": "finance", "tools": "payments.*, refunds.issue", "members": [first], "two_approvers": "1"}
    answer = client.post(f"/w/{team.slug}/settings/approvers/", form, **HTMX)
    assert answer.status_code == 200 and "Saved the approver group finance" in answer.content.decode()
    row = ApproverGroup.objects.get(workspace=team.workspace, name="finance")
    assert (row.tools, row.two_approvers, [m.username for m in row.members.all()]) == (
        ["payments.*", "refunds.issue"],
        True,
        [first],
    )
    changed = client.post(f"/w/{team.slug}/settings/approvers/", {**form, "members": [operator], "two_approvers": ""}, **HTMX)
    assert changed.status_code == 200 and ApproverGroup.objects.filter(workspace=team.workspace).count() == 1
    row.refresh_from_db()
    assert not row.two_approvers and [m.username for m in row.members.all()] == [operator]
    gone = client.post(f"/w/{team.slug}/settings/approvers/{row.pk}/delete/", **HTMX)
    assert (
        gone.status_code == 200
        and "No approver groups" in gone.content.decode()
        and not ApproverGroup.objects.filter(workspace=team.workspace).exists()
    )


def test_a_member_who_is_not_an_operator_is_refused_in_the_page_and_nothing_is_saved(team: Team) -> None:
    client = browser(team.users["operator"])
    form = {"name": "finance", "tools": "payments.*", "members": [team.users["reader"].username]}
    answer = client.post(f"/w/{team.slug}/settings/approvers/", form, **HTMX)
    assert answer.status_code == 400 and "only operators decide calls" in answer.content.decode()
    assert not ApproverGroup.objects.filter(workspace=team.workspace).exists()


def test_a_bad_pattern_is_refused_in_the_page_and_nothing_is_saved(team: Team) -> None:
    client = browser(team.users["operator"])
    answer = client.post(f"/w/{team.slug}/settings/approvers/", {"name": "finance", "tools": "pay[ments"}, **HTMX)
    assert answer.status_code == 400 and "is not a tool pattern" in answer.content.decode()
    assert not ApproverGroup.objects.filter(workspace=team.workspace).exists()


def test_an_operator_sets_the_deadlines_in_minutes_and_bad_ones_are_refused(team: Team) -> None:
    client = browser(team.users["operator"])
    ApproverGroup.objects.create(workspace=team.workspace, name="leads", tools=["*"])
    form = {"reminder_minutes": "10", "escalation_minutes": "45", "escalate_to": "leads"}
    answer = client.post(f"/w/{team.slug}/settings/deadlines/", form, **HTMX)
    assert answer.status_code == 200 and "Saved the deadlines" in answer.content.decode()
    workspace = Workspace.objects.get(pk=team.workspace.pk)
    assert (workspace.reminder_seconds, workspace.escalation_seconds, workspace.escalate_to.name) == (600, 2700, "leads")
    for bad in ({"reminder_minutes": "ten"}, {"reminder_minutes": "50", "escalation_minutes": "40"}):
        refused = client.post(f"/w/{team.slug}/settings/deadlines/", bad, **HTMX)
        assert refused.status_code == 400 and 'role="alert"' in refused.content.decode()
    assert Workspace.objects.get(pk=team.workspace.pk).reminder_seconds == 600
    page = client.post(f"/w/{team.slug}/settings/deadlines/", {"reminder_minutes": "", "escalation_minutes": "0"})
    assert page.status_code == 302
    assert Workspace.objects.filter(pk=team.workspace.pk).values_list("reminder_seconds", "escalation_seconds").get() == (
        None,
        0,
    )


def test_the_audit_page_shows_the_platforms_entries(team: Team, payer: Any) -> None:
    payment(team)
    page = browser(team.users["viewer"]).get(f"/w/{team.slug}/audit/").content.decode()
    assert "assigned to group finance" in page and 'data-verb="assign"' in page
    assert kernel.NotAnApprover(("finance",)).status == 403
