"""The `test.*` tools on a real install: off unless asked for, bounded, and their ledger scoped to workspaces."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from oz0cli import Fatal
from oz0cli import environment as cli
from runs.models import Run
from tests.conftest import Team
from tests.runs.driver import drive, task


def test_it_installs_the_test_tools_under_up_only_with_demo_or_the_variable() -> None:
    """Before, `./oz0 up` set OZ0_TEST_TOOLS=1 for every install, DEBUG=0 included."""
    assert cli.up_environment([], {}) == {"OZ0_TEST_TOOLS": "0"}
    assert cli.up_environment([], {"OZ0_TEST_TOOLS": "1"}) == {"OZ0_TEST_TOOLS": "1"}
    assert cli.up_environment(["--demo"], {}) == {"OZ0_TEST_TOOLS": "1"}
    assert cli.up_environment(["--demo"], {"OZ0_TEST_TOOLS": "0"}) == {"OZ0_TEST_TOOLS": "1"}
    with pytest.raises(Fatal, match="up takes only --demo"):
        cli.up_environment(["--frobnicate"], {})


def test_it_refuses_test_tools_when_they_are_not_installed(team: Team, settings: Any) -> None:
    settings.OZ0_TEST_TOOLS = False
    status, body = team.api().post(
        f"/workspaces/{team.slug}/runs", {"tasks": [{"key": "s", "kind": "tool", "tool": "test.sleep", "args": {"seconds": 1}}]}
    )
    assert status == 400 and body["error"]["key"] == "unknown_tool"
    status, body = team.api().get("/test/effects/anything")
    assert status == 404


@pytest.mark.parametrize("tool", ["test.sleep", "test.effect"])
def test_it_caps_how_long_a_test_tool_holds_a_worker_slot(team: Team, tool: str, no_dispatch: list[int]) -> None:
    """Before, test.sleep slept as long as asked: one operator could hold every workspace's worker slots."""
    body = {"tasks": [{"key": "s", "kind": "tool", "tool": tool, "args": {"seconds": 10**9, "id": uuid.uuid4().hex}}]}
    status, created = team.api().post(f"/workspaces/{team.slug}/runs", body)
    assert status == 201, created
    run = drive(Run.objects.get(pk=created["run"]["id"]))  # would sleep for 31 years before the cap
    call = task(run, "s")
    assert (call.status, call.error_key) == ("failed", "tool_failed")
    assert "OZ0_TEST_SLEEP_MAX" in str(call.error_detail)


def test_it_still_sleeps_within_the_cap(team: Team, no_dispatch: list[int]) -> None:
    body = {"tasks": [{"key": "s", "kind": "tool", "tool": "test.sleep", "args": {"seconds": 0.05}}], "deliverable": "s"}
    status, created = team.api().post(f"/workspaces/{team.slug}/runs", body)
    run = drive(Run.objects.get(pk=created["run"]["id"]))
    assert run.status == "completed" and run.output == 0.05


@pytest.mark.parametrize("role,count", [("operator", 1), ("reader", 1), ("viewer", 1), ("outsider", 0), ("other_operator", 0)])
def test_it_counts_test_effects_only_for_members_of_the_runs_workspace(
    team: Team, role: str, count: int, no_dispatch: list[int]
) -> None:
    """Before, the ledger answered anyone with any effect id, whatever workspace ran it."""
    effect = uuid.uuid4().hex
    body = {"tasks": [{"key": "e", "kind": "tool", "tool": "test.effect", "args": {"id": effect}}]}
    status, created = team.api().post(f"/workspaces/{team.slug}/runs", body)
    drive(Run.objects.get(pk=created["run"]["id"]))
    other = Team()
    api = other.api() if role == "other_operator" else team.api(role)
    status, body = api.get(f"/test/effects/{effect}")
    assert status == 200 and body == {"id": effect, "count": count}
    status, body = api.get(f"/test/effects/{effect}?workspace={team.slug}")
    assert status == (200 if count else 404)
    if role == "other_operator":
        # Running the same effect id in one's own workspace counts one's own executions only.
        status, created = other.api().post(f"/workspaces/{other.slug}/runs", {"tasks": body_tasks(effect)})
        drive(Run.objects.get(pk=created["run"]["id"]))
        assert other.api().get(f"/test/effects/{effect}")[1]["count"] == 1
        assert team.api().get(f"/test/effects/{effect}")[1]["count"] == 1


def body_tasks(effect: str) -> list[dict[str, Any]]:
    return [{"key": "e", "kind": "tool", "tool": "test.effect", "args": {"id": effect}}]


def test_it_answers_a_huge_effect_id_without_an_error(team: Team) -> None:
    status, body = team.api().get(f"/test/effects/{'x' * 5000}")
    assert status == 200 and body["count"] == 0


def test_a_real_install_has_neither_the_test_tools_app_nor_their_functions_nor_their_route() -> None:
    """The test tools' models lived among runs' production models: a real install carried their
    tables and their functions. Now they are an app installed only with OZ0_TEST_TOOLS=1."""
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    probe = (
        "import django, json; django.setup()\n"
        "from django.apps import apps\n"
        "from runs.worker.tool_functions import function_of, FUNCTIONS\n"
        "from oz0site.api import api\n"
        "paths = api.get_openapi_schema()['paths']\n"
        "print(json.dumps([apps.is_installed('testtools'), sorted(FUNCTIONS), any('/test/' in p for p in paths)]))\n"
    )
    probes = {
        flag: subprocess.Popen(
            [sys.executable, "-c", probe],
            cwd=ROOT,
            env={**os.environ, "OZ0_TEST_TOOLS": flag},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for flag in ("0", "1")
    }
    answers = {}
    for flag, process in probes.items():
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        answers[flag] = json.loads(out.strip().splitlines()[-1])
    assert answers["0"] == [False, ["clock.now"], False]
    installed, functions, route = answers["1"]
    assert installed and route and {"test.echo", "test.effect", "test.flaky", "clock.now"} <= set(functions)


def test_no_production_module_imports_the_test_tools() -> None:
    import ast

    from tests.conftest import ROOT

    allowed = {"oz0site/api.py"}  # mounts their route only when the app is installed
    offenders = []
    for path in ROOT.glob("*/**/*.py"):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith((".venv/", "tests/", "testtools/", "bench/")) or relative in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if any(name == "testtools" or name.startswith("testtools.") for name in names):
                offenders.append(relative)
    assert not offenders, offenders


@pytest.mark.spec("S10")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("went_through", [True, False], ids=["written-then-lost", "not-written"])
def test_an_effect_whose_write_lost_its_answer_is_recorded_once_and_its_call_goes_on(
    monkeypatch: pytest.MonkeyPatch, went_through: bool
) -> None:
    """The chaos run's PostgreSQL kill once met `test.effect` mid-write: the call was left to the
    lease sweep, and its non-replayable call waited for a person though its worker lived. The
    tool now waits for its ledger and asks it, by the execution's key, whether the write was made."""
    from django.db import OperationalError

    from runs.worker import reporting
    from runs.worker.tool_functions import ToolContext
    from testtools.functions import FUNCTIONS
    from testtools.models import EffectRecord

    monkeypatch.setattr(reporting.time, "sleep", lambda seconds: None)
    write = EffectRecord.objects.create
    lost: list[bool] = []

    def write_losing_its_first_answer(**fields: Any) -> EffectRecord:
        if not lost:
            lost.append(True)
            if went_through:
                write(**fields)
            raise OperationalError("server closed the connection unexpectedly")
        return write(**fields)

    monkeypatch.setattr(EffectRecord.objects, "create", write_losing_its_first_answer)
    effect_id = uuid.uuid4().hex
    context = ToolContext(run_id=str(uuid.uuid4()), task_key="e", attempt=1, execution=f"host:1:{effect_id[:12]}")
    assert FUNCTIONS["test.effect"]({"id": effect_id}, context) == {"id": effect_id}
    assert lost == [True]
    records = list(EffectRecord.objects.filter(effect_id=effect_id))
    assert len(records) == 1 and records[0].execution == context.execution and records[0].finished_at is not None
