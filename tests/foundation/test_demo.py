"""`manage.py demo`: the demo workspace, a user per role, and runs in every interesting state."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from runs import kernel
from runs.management.commands.demo import demo_password
from runs.models import Membership, Run, Task
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
            lambda: Task.objects.filter(run=demo_run("running"), key="long-wait", status="running").exists(),
            message="the running run",
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
            kernel.cancel_run(run_id=run.pk, user=None, reason="test over")  # frees the worker from the hour-long sleep
    # The cancel reaches the hour-long sleep in the worker: the call stops and the run ends.
    wait_for(lambda: demo_run("running").status == "canceled", timeout=30, message="the sleep to stop")

    for role in ("operator", "reader", "viewer"):
        user = User.objects.get(username=f"demo-{role}")
        assert Membership.objects.get(user=user, workspace__slug="demo").role == role
        assert user.check_password(demo_password(user.username))
        assert f"demo-{role}" in out.getvalue() and demo_password(user.username) in out.getvalue()


@pytest.mark.django_db
def test_it_refuses_without_the_test_tools(settings: Any) -> None:
    from django.core.management import CommandError

    settings.OZ0_TEST_TOOLS = False
    with pytest.raises(CommandError, match="OZ0_TEST_TOOLS"):
        call_command("demo", stdout=StringIO())
    assert not Run.objects.exists()
