"""Code has a version (issue 29): the digest of the code the installer lets a harness run is
recorded on the version at registration, on each run at its creation and on each round at its
start; the run page says when a run's code is not its version's, and the scorecard counts the runs
of a version per code digest, so a code change under one manifest is told from a manifest change."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from oz0agents.code_version import code_digest, code_files
from oz0agents.registry import register
from runs.models import Run, Task
from tests.conftest import Team
from tests.harness.conftest import harness_manifest, jsonl_manifest, start_run

SLOW = 30
CODE = (
    "from pydantic_ai import Agent\n"
    "from pydantic_ai.models.function import FunctionModel\n"
    "from pydantic_ai.messages import ModelResponse, TextPart\n"
    "agent = Agent(FunctionModel(lambda messages, info: ModelResponse(parts=[TextPart({!r})])))\n"
)


@pytest.fixture
def agent_module(settings: Any) -> Iterator[Path]:
    """A module the installer allows, in a folder of OZ0_AGENT_PATH the test may rewrite."""
    folder = Path(tempfile.mkdtemp(prefix="oz0-test-code-version-"))
    folder.chmod(0o755)
    settings.OZ0_HARNESS_MODULES = ["oz0_test_versioned"]
    settings.OZ0_AGENT_PATH = [str(folder)]
    yield folder / "oz0_test_versioned.py"
    shutil.rmtree(folder, ignore_errors=True)


def _manifest() -> str:
    return harness_manifest("pa-versioned", {"pydantic_ai": "oz0_test_versioned:agent"})


def test_a_module_target_is_versioned_by_its_files_and_a_program_by_its_file_not_its_interpreter(
    agent_module: Path, settings: Any
) -> None:
    agent_module.write_text(CODE.format("one"))
    harness = {"kind": "pydantic_ai", "target": "oz0_test_versioned:agent"}
    assert [label for label, _ in code_files(harness)] == ["oz0_test_versioned.py"]
    first = code_digest({"harness": harness})
    agent_module.write_text(CODE.format("two"))
    assert len(first) == 64 and code_digest({"harness": harness}) not in ("", first)
    # A module the installer does not allow has no code oz0 would run.
    settings.OZ0_HARNESS_MODULES = ["something_else"]
    assert code_digest({"harness": harness}) == ""
    program = {"kind": "jsonl", "program": "scripted"}
    assert [label for label, _ in code_files(program)] == ["argv[1]:tests/harness/scripted_harness.py"]
    assert code_digest({"harness": {"kind": "jsonl", "program": "not-a-program"}}) == ""
    assert code_digest({"name": "own-loop", "instructions": "no harness"}) == ""


@pytest.mark.spec("F7", "F18")
def test_a_run_after_the_code_changed_under_the_same_manifest_says_so_and_the_scorecard_counts_each_code(
    harness_team: Team, agent_module: Path
) -> None:
    agent_module.write_text(CODE.format("the first code"))
    registered = register(_manifest(), workspace=harness_team.workspace)
    version = registered.version
    assert len(version.code_digest) == 64
    first, thread = start_run(harness_team, _manifest())
    thread.join(SLOW)
    first.refresh_from_db()
    assert first.output == "the first code" and first.code_digest == version.code_digest
    assert Task.objects.get(run=first, key="r1").result["code_digest"] == version.code_digest

    agent_module.write_text(CODE.format("the second code"))
    again = register(_manifest(), workspace=harness_team.workspace)
    assert (again.created, again.version.pk, again.version.code_digest) == (False, version.pk, version.code_digest)
    second, thread = start_run(harness_team, _manifest())
    thread.join(SLOW)
    second.refresh_from_db()
    assert second.output == "the second code" and second.agent_version_id == version.pk
    assert second.code_digest not in ("", version.code_digest)
    assert Task.objects.get(run=second, key="r1").result["code_digest"] == second.code_digest

    status, document = harness_team.api("viewer").get(f"/runs/{second.pk}")
    assert status == 200
    assert document["code"] == {
        "digest": second.code_digest,
        "version_digest": version.code_digest,
        "changed_since_version": True,
        "rounds_on_other_code": [],
    }
    _, unchanged = harness_team.api("viewer").get(f"/runs/{first.pk}")
    assert unchanged["code"]["changed_since_version"] is False

    client = Client()
    client.force_login(harness_team.users["viewer"])
    page = client.get(f"/runs/{second.pk}/").content.decode()
    assert second.code_digest[:12] in page and "code changed since v1 was registered" in page
    assert "code changed since" not in client.get(f"/runs/{first.pk}/").content.decode()

    status, card = harness_team.api("viewer").get(f"/insights/agents/pa-versioned?workspace={harness_team.slug}")
    assert status == 200, card
    assert [(c["digest"], c["runs"], c["registered"]) for c in card["versions"][0]["code"]] == [
        (version.code_digest, 1, True),
        (second.code_digest, 1, False),
    ]
    scorecard_page = client.get(f"/w/{harness_team.slug}/agents/pa-versioned/").content.decode()
    assert version.code_digest[:12] in scorecard_page and second.code_digest[:12] in scorecard_page


def test_a_round_that_loads_code_changed_since_its_run_began_is_named(harness_team: Team) -> None:
    script = [{"done": "fine"}]
    run, thread = start_run(harness_team, jsonl_manifest("jl-drift", script))
    thread.join(SLOW)
    Run.objects.filter(pk=run.pk).update(code_digest="0" * 64)  # as if the code changed after the run began
    _, document = harness_team.api("viewer").get(f"/runs/{run.pk}")
    assert document["code"]["rounds_on_other_code"] == ["r1"]
    assert document["code"]["changed_since_version"] is True
