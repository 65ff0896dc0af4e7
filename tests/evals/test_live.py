"""An eval on the live stack (issue 31 item 5): the Celery worker runs the case's runs, and
`./oz0 eval run --wait` polls the database until each has its outcome."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from evals import cases
from runs import kernel
from runs.models import Run
from tests.conftest import Team, wait_for
from tests.evals.cases import FAILS_ALWAYS, FIXED_BY_V2, register_version, scripted_agent

pytestmark = pytest.mark.live


def failed(team: Team, agent: str, script: list[Any]) -> Run:
    body = {"agent": agent, "input": {"issue": 7}, "tasks": [{"key": "r1", "kind": "round", "model": "script", "script": script}]}
    run, _ = kernel.create_run(workspace=team.workspace, user=team.users["operator"], body=body)
    return wait_for(lambda: Run.objects.filter(pk=run.pk, failure__isnull=False).first(), message="the run to fail")


def test_the_command_waits_for_the_workers_and_prints_each_case(live_team: Team) -> None:
    agent = scripted_agent(live_team)
    fixed = cases.keep(user=live_team.users["operator"], run_id=failed(live_team, agent, FIXED_BY_V2).pk)[0]
    still = cases.keep(user=live_team.users["operator"], run_id=failed(live_team, agent, FAILS_ALWAYS).pk)[0]
    register_version(live_team, agent, "oz.fail, test.echo")
    out = StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command(
            "eval_run", agent, "--version", "2", "--workspace", live_team.slug, "--wait", "--timeout", "60",
            "--as", live_team.users["operator"].username, stdout=out,
        )  # fmt: skip
    text = out.getvalue()
    assert exited.value.code == 1, text
    # Rows start with a case's id; the summary starts with a count that may equal one ("1 passed, ...").
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line[:1].isdigit() and " passed, " not in line}
    assert rows[str(fixed.pk)][1:5] == ["model", "completed", "completed", "passed"]
    assert rows[str(still.pk)][1:5] == ["not_found", "not_found", "failed", "FAILED"]
    assert "1 passed, 1 failed, 0 pending" in text
    eval_runs = Run.objects.filter(rollout="eval", agent_name=agent)
    assert {(r.agent_version.version, r.created_by_id) for r in eval_runs} == {(2, live_team.users["operator"].pk)}
