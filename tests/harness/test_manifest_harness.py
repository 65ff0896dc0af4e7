"""The manifest's `harness:` field (F7): validated and linted with line numbers like the rest of the
manifest, normalized for the worker; the F8 warnings still apply to a harnessed agent. The
installer, never a workspace, decides what code runs: a program the installer lists by name, an
import target under its module prefixes that a confined child process loads."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from oz0agents.lint import lint
from tests.conftest import Team

PROGRAM_PROBLEMS = "OZ0_HARNESS_PROGRAMS"


def _lint(text: str):  # type: ignore[no-untyped-def]
    return lint(textwrap.dedent(text))


@pytest.mark.spec("F7")
def test_it_normalizes_each_harness_kind() -> None:
    cases = {
        "harness: oz0": None,
        'harness: {pydantic_ai: "oz0_test_pydantic_agents:echo"}': {
            "kind": "pydantic_ai",
            "target": "oz0_test_pydantic_agents:echo",
        },
        'harness: {openai_agents: "oz0_test_sdk_agents:echo"}': {"kind": "openai_agents", "target": "oz0_test_sdk_agents:echo"},
        "harness: {acp: {program: acp-scripted, env: {MODE: fast}}}": {
            "kind": "acp",
            "program": "acp-scripted",
            "env": {"MODE": "fast"},
        },
        "harness: {jsonl: {program: jsonl-example}}": {"kind": "jsonl", "program": "jsonl-example", "env": {}},
    }
    for line, expected in cases.items():
        linted = lint(f"name: a\nmodel: script\n{line}\ntools: [test.echo]\n")
        assert linted.errors == [], (line, linted.errors)
        assert linted.manifest is not None and linted.manifest.get("harness") == expected, line
        if expected is None:
            assert "harness" not in linted.manifest


@pytest.mark.spec("F7")
def test_a_harnessed_agent_needs_no_model_and_an_unharnessed_one_still_does() -> None:
    linted = lint("name: a\nharness: {jsonl: {program: scripted}}\n")
    assert linted.ok and linted.manifest is not None and linted.manifest["model"] == "harness:jsonl"
    assert [e.field for e in lint("name: a\nharness: oz0\n").errors] == ["model"]


@pytest.mark.spec("F7", "F8")
def test_it_refuses_bad_harnesses_with_their_lines() -> None:
    text = """\
        name: a
        model: script
        harness:
          jsonl:
            program: scripted
            env: {GOOD: yes, 1BAD: x}
        """
    errors = _lint(text).errors
    assert [(e.line, e.field) for e in errors] == [(6, "harness.jsonl.env.GOOD"), (6, "harness.jsonl.env")]
    for text, line, field, words in [
        ("name: a\nmodel: script\nharness: langchain\n", 3, "harness", "not a harness"),
        ("name: a\nmodel: script\nharness:\n  crewai: x\n", 4, "harness", "not a harness kind"),
        ("name: a\nmodel: script\nharness: {pydantic_ai: not-a-target}\n", 3, "harness.pydantic_ai", "package.module:attribute"),
        ("name: a\nmodel: script\nharness: {jsonl: {program: []}}\n", 3, "harness.jsonl.program", PROGRAM_PROBLEMS),
        ("name: a\nmodel: script\nharness: {jsonl: {program: scripted, cwd: /}}\n", 3, "harness.jsonl", "unknown field"),
        ("name: a\nmodel: script\nharness: {jsonl: {program: x}, acp: {program: y}}\n", 3, "harness", "exactly one"),
    ]:
        errors = lint(text).errors
        assert len(errors) == 1, (text, errors)
        assert (errors[0].line, errors[0].field) == (line, field) and words in errors[0].message, (text, errors[0])


@pytest.mark.spec("F7")
def test_a_command_of_the_manifests_own_is_refused_naming_the_setting() -> None:
    text = """\
        name: a
        harness:
          jsonl:
            command: [python, -c, "import os; print(os.environ)"]
        """
    errors = _lint(text).errors
    assert [(e.line, e.field) for e in errors] == [(4, "harness.jsonl.command")]
    assert "OZ0_HARNESS_PROGRAMS" in errors[0].message and "program: NAME" in errors[0].message
    errors = lint("name: a\nharness: {acp: {command: [/bin/sh]}}\n").errors
    assert [e.field for e in errors] == ["harness.acp.command"]


@pytest.mark.spec("F7")
def test_a_program_the_installer_does_not_list_is_an_error_naming_the_allowed_ones() -> None:
    errors = lint("name: a\nharness: {jsonl: {program: bitcoin-miner}}\n").errors
    assert [(e.line, e.field) for e in errors] == [(2, "harness.jsonl.program")]
    assert "'bitcoin-miner' is no program the installer allows" in errors[0].message
    assert "OZ0_HARNESS_PROGRAMS" in errors[0].message and "scripted" in errors[0].message


@pytest.mark.spec("F7")
def test_the_example_programs_and_modules_are_allowed_only_while_the_examples_are(settings: Any) -> None:
    example = "name: a\nharness: {jsonl: {program: jsonl-example}}\n"
    example_module = 'name: a\nharness: {pydantic_ai: "pydantic_triage:agent"}\n'
    assert lint(example).ok and lint(example_module).ok
    settings.OZ0_HARNESS_EXAMPLES = False
    assert [e.field for e in lint(example).errors] == ["harness.jsonl.program"]
    errors = lint(example_module).errors
    assert [e.field for e in errors] == ["harness.pydantic_ai"] and "OZ0_HARNESS_MODULES" in errors[0].message
    assert lint("name: a\nharness: {jsonl: {program: scripted}}\n").ok  # the installer's own stay


@pytest.mark.spec("F7")
def test_a_broken_programs_file_is_an_error_naming_the_setting(settings: Any, tmp_path: Path) -> None:
    broken = tmp_path / "programs.yaml"
    broken.write_text("scripted: {argv: [python], cwd: /}\n")
    settings.OZ0_HARNESS_PROGRAMS = str(broken)
    errors = lint("name: a\nharness: {jsonl: {program: scripted}}\n").errors
    assert len(errors) == 1 and "OZ0_HARNESS_PROGRAMS" in errors[0].message and "unknown field" in errors[0].message
    settings.OZ0_HARNESS_PROGRAMS = str(tmp_path / "missing.yaml")
    assert "cannot be read" in lint("name: a\nharness: {jsonl: {program: scripted}}\n").errors[0].message


@pytest.mark.spec("F7")
def test_a_manifest_env_may_not_set_what_changes_the_programs_code() -> None:
    for name in ("LD_PRELOAD", "PYTHONPATH", "PYTHONSTARTUP", "NODE_OPTIONS", "PATH", "HOME", "BASH_ENV"):
        errors = lint(f"name: a\nharness: {{jsonl: {{program: scripted, env: {{{name}: x}}}}}}\n").errors
        assert [e.field for e in errors] == [f"harness.jsonl.env.{name}"], name
    assert lint("name: a\nharness: {jsonl: {program: scripted, env: {TRIAGE_MODE: strict}}}\n").ok


@pytest.mark.spec("F7")
def test_an_import_target_must_lie_under_an_allowed_prefix_and_load_in_a_child() -> None:
    for target, words in [
        ("os:system", "not under a prefix the installer allows in OZ0_HARNESS_MODULES"),
        ("oz0_test_pydantic_agentsx:agent", "not under a prefix"),
        ("oz0_test_pydantic_agents:not_an_agent", "not a pydantic_ai.Agent"),
        ("oz0_test_pydantic_agents:nothing_here", "has no attribute 'nothing_here'"),
        ("oz0_test_pydantic_agents.missing:agent", "No module named"),
    ]:
        errors = lint(f'name: a\nharness: {{pydantic_ai: "{target}"}}\n').errors
        assert len(errors) == 1 and errors[0].field == "harness.pydantic_ai", (target, errors)
        assert words in errors[0].message, (target, errors[0].message)
    errors = lint('name: a\nharness: {openai_agents: "oz0_test_sdk_agents:not_an_agent"}\n').errors
    assert len(errors) == 1 and "not an agents.Agent" in errors[0].message
    import sys

    assert "oz0_test_pydantic_agents" not in sys.modules  # the import ran in a child, never here


@pytest.mark.spec("F7")
def test_a_target_that_cannot_be_checked_here_is_a_warning(settings: Any) -> None:
    from runs.worker.harness import bridges

    bridges._checked.clear()  # a module that loaded lately is not loaded again
    settings.OZ0_HARNESS_USER = "no-such-user-oz0"
    linted = lint('name: a\nharness: {pydantic_ai: "oz0_test_pydantic_agents:slow"}\n')
    assert linted.ok and [w.field for w in linted.warnings] == ["harness.pydantic_ai"]
    assert "could not be checked here" in linted.warnings[0].message


@pytest.mark.spec("F7", "S22")
def test_registration_refuses_a_command_with_a_typed_error_naming_the_setting(team: Team) -> None:
    manifest = "name: sneaky\nharness:\n  jsonl:\n    command: [cat, /proc/1/environ]\n"
    status, body = team.api("operator").post(f"/workspaces/{team.slug}/agents", {"manifest": manifest})
    assert status == 400 and body["error"]["key"] == "invalid_manifest"
    assert [(e["line"], e["field"]) for e in body["error"]["errors"]] == [(4, "harness.jsonl.command")]
    assert "OZ0_HARNESS_PROGRAMS" in body["error"]["errors"][0]["message"]
    status, body = team.api("operator").post("/agents/lint", {"manifest": manifest, "workspace": team.slug})
    assert status == 200 and "OZ0_HARNESS_PROGRAMS" in body["errors"][0]["message"]


@pytest.mark.spec("F7", "F8")
def test_the_f8_warnings_still_apply_to_a_harnessed_agent() -> None:
    no_fail = _lint(
        """\
        name: a
        harness: {jsonl: {program: scripted}}
        tools: [test.echo]
        failures:
          - {kind: not_found, description: gone}
        """
    )
    assert no_fail.ok and [(w.line, w.field) for w in no_fail.warnings] == [(4, "failures")]
    no_kinds = _lint(
        """\
        name: a
        harness: {pydantic_ai: "oz0_test_pydantic_agents:echo"}
        tools: [oz.fail]
        """
    )
    assert no_kinds.ok and [(w.line, w.field) for w in no_kinds.warnings] == [(3, "tools")]


@pytest.mark.spec("F7")
def test_a_jsonl_program_may_say_it_speaks_protocol_2_and_nothing_else_may() -> None:
    for text, expected in (("protocol: 2", {"protocol": 2}), ("protocol: 1", {}), ("", {})):
        linted = lint(f"name: a\nharness: {{jsonl: {{program: scripted, {text}}}}}\n")
        assert linted.ok and linted.manifest is not None, (text, linted.errors)
        assert linted.manifest["harness"] == {"kind": "jsonl", "program": "scripted", "env": {}, **expected}, text
    for text, field in (
        ("harness: {jsonl: {program: scripted, protocol: 3}}", "harness.jsonl.protocol"),
        ("harness: {jsonl: {program: scripted, protocol: true}}", "harness.jsonl.protocol"),
        ("harness: {acp: {program: acp-scripted, protocol: 2}}", "harness.acp"),
    ):
        assert [e.field for e in lint(f"name: a\n{text}\n").errors] == [field], text
