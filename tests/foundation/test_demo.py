"""`manage.py demo`: the demo workspace, a user per role, and runs in every interesting state."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from runs import kernel
from runs.management.commands.demo import demo_password
from runs.models import Run, Task
from tenancy.models import Membership
from tests.conftest import LiveStack, wait_for


def demo_run(marker: str) -> Run:
    return Run.objects.get(workspace__slug="demo", input__demo=marker)


def state(marker: str) -> tuple[str, str | None, str | None]:
    run = demo_run(marker)
    return run.status, (run.attention or {}).get("reason"), (run.failure or {}).get("kind")


@pytest.mark.live
def test_it_loads_runs_in_every_interesting_state(live: LiveStack) -> None:
    out = StringIO()
    call_command("demo", stdout=out)
    try:
        wait_for(lambda: state("completed")[0] == "completed", message="the completed run")
        wait_for(
            lambda: Task.objects.filter(run=demo_run("running"), key="on-runner", status="dispatched").exists(),
            message="the running run (a call waiting for a runner)",
        )
        wait_for(
            lambda: Task.objects.filter(run=demo_run("awaiting-approval"), status="needs_approval").exists(),
            message="the approval",
        )
        wait_for(lambda: state("asking") == ("running", "awaiting_human", None), message="the question")
        wait_for(lambda: state("held")[:2] == ("needs_attention", "halt_failure"), message="the halt hold")
        wait_for(lambda: state("canceled") == ("canceled", None, "undeclared"), message="the typed cancel")
        assert demo_run("running").status == "running"
        assert "approval_required" in demo_run("awaiting-approval").announcements

        # Idempotent: a second load creates no runs and keeps the passwords.
        count = Run.objects.filter(workspace__slug="demo").count()
        again = StringIO()
        call_command("demo", stdout=again)
        assert Run.objects.filter(workspace__slug="demo").count() == count
        assert "runs already loaded" in again.getvalue()
    finally:
        for run in Run.objects.filter(workspace__slug="demo", status__in=["pending", "running", "paused", "needs_attention"]):
            try:
                kernel.cancel_run(run_id=run.pk, user=None, reason="test over")
            except kernel.Conflict as finished:  # the worker may end a run between the read and the cancel
                assert finished.key == "run_finished"
    wait_for(lambda: demo_run("running").status == "canceled", timeout=30, message="the runner call to stop")

    for role in ("operator", "reader", "viewer"):
        user = User.objects.get(username=f"demo-{role}")
        assert Membership.objects.get(user=user, workspace__slug="demo").role == role
        assert user.check_password(demo_password(user.username))
        assert f"demo-{role}" in out.getvalue() and demo_password(user.username) in out.getvalue()


@pytest.mark.thorough
@pytest.mark.django_db
def test_it_loads_the_demo_without_the_test_tools(settings: Any, no_dispatch: list[int]) -> None:
    """A real install (no `test.*` tools) still gets the whole demo: its runs use only what every install has."""
    settings.OZ0_TEST_TOOLS = False
    call_command("demo", stdout=StringIO())
    markers = set(Run.objects.filter(workspace__slug="demo").values_list("input__demo", flat=True))
    assert {"completed", "running", "awaiting-approval", "asking", "held", "canceled", "agent:triage"} <= markers
    tools = {t.spec.get("tool") for t in Task.objects.filter(run__workspace__slug="demo", kind="tool")}
    assert not any(str(tool).startswith("test.") for tool in tools)


@pytest.mark.thorough
@pytest.mark.django_db
def test_it_registers_the_agents_as_the_demo_workspaces(no_dispatch: list[int]) -> None:
    from oz0agents.models import Agent

    call_command("demo", stdout=StringIO())
    assert set(Agent.objects.filter(name__in=["triage", "assistant", "reviewer"]).values_list("workspace__slug", flat=True)) == {
        "demo"
    }


@pytest.mark.thorough
@pytest.mark.django_db
def test_it_loads_the_demo_without_the_example_harnesses(settings: Any, no_dispatch: list[int]) -> None:
    """A production install turns the examples' code off (OZ0_HARNESS_EXAMPLES=0): the demo still
    loads, without the harnessed example agents, whose programs and modules are then not allowed."""
    settings.OZ0_HARNESS_EXAMPLES = False
    call_command("demo", stdout=StringIO())
    markers = set(Run.objects.filter(workspace__slug="demo").values_list("input__demo", flat=True))
    assert {"completed", "agent:triage"} <= markers
    assert not {"agent:jsonl-triage", "agent:acp-triage", "agent:pydantic-triage", "agent:openai-triage"} & markers
