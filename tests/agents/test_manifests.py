"""Agent manifests: validation as F2-F6 say, the F8 warnings, normalization and versions."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from oz0agents.lint import InvalidManifest, lint
from oz0agents.models import AgentVersion
from oz0agents.parsing import NODES_MAX, Problem
from oz0agents.registry import register

BASE = """\
name: {name}
model: script
tools: [oz.fail, test.echo]
failures:
{failures}
"""


def _failures(*items: str) -> str:
    return "".join(items)


def _kind(kind: str, description: str = "Something went wrong") -> str:
    return f"  - kind: {kind}\n    description: {description}\n"


def _errors(text: str) -> list[Problem]:
    return lint(text).errors


def _one(text: str) -> Problem:
    errors = _errors(text)
    assert len(errors) == 1, errors
    return errors[0]


@pytest.mark.spec("F2")
def test_it_normalizes_a_valid_manifest_with_explicit_flags() -> None:
    text = textwrap.dedent(
        """\
        name: reader
        model: openai:gpt-4o-mini
        fallback_models: [anthropic:claude-x]
        instructions: Read it.
        tools:
          - oz.fail
          - {name: test.echo, on_failure: halt}
        failures:
          - kind: not_found
            description: The issue does not exist
            person: true
        approval: {mode: rules, rules: [{tool: "test.*", decision: allow}]}
        """
    )
    linted = lint(text)
    assert linted.errors == [] and linted.warnings == []
    assert linted.manifest == {
        "name": "reader",
        "model": "openai:gpt-4o-mini",
        "fallback_models": ["anthropic:claude-x"],
        "instructions": "Read it.",
        "tools": ["oz.fail", "test.echo"],
        "tool_on_failure": {"test.echo": "halt"},
        "failures": [
            {"kind": "not_found", "description": "The issue does not exist", "retryable": False, "partial": False, "person": True}
        ],
        "approval": {"mode": "rules", "rules": [{"tool": "test.*", "decision": "allow"}]},
    }


@pytest.mark.spec("F3")
def test_it_refuses_a_kind_of_41_characters_with_its_line() -> None:
    problem = _one(BASE.format(name="a", failures=_failures(_kind("ok"), _kind("k" * 41))))
    assert problem.field == "failures[1].kind" and "41 characters" in problem.message and "at most 40" in problem.message
    assert problem.line == 7
    assert _errors(BASE.format(name="a", failures=_kind("k" * 40))) == []


@pytest.mark.spec("F3")
@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("NotFound", "lowercase"),
        ("1st", "starting with a letter"),
        ("has-dash", "lowercase"),
        ("timeout", "platform kind"),
        ("undeclared", "platform kind"),
    ],
)
def test_it_refuses_a_badly_formed_or_platform_kind(kind: str, words: str) -> None:
    problem = _one(BASE.format(name="a", failures=_kind(kind)))
    assert problem.field == "failures[0].kind" and words in problem.message


@pytest.mark.spec("F3")
def test_it_refuses_a_duplicate_kind() -> None:
    problem = _one(BASE.format(name="a", failures=_failures(_kind("gone"), _kind("gone"))))
    assert problem.field == "failures[1].kind" and "twice" in problem.message and problem.line == 7


@pytest.mark.spec("F4")
def test_it_refuses_a_missing_or_201_character_description() -> None:
    missing = _one(BASE.format(name="a", failures="  - kind: gone\n"))
    assert missing.field == "failures[0].description" and "required" in missing.message
    long = _one(BASE.format(name="a", failures=_kind("gone", "d" * 201)))
    assert long.field == "failures[0].description" and "201 characters" in long.message and long.line == 6
    assert _errors(BASE.format(name="a", failures=_kind("gone", "d" * 200))) == []


@pytest.mark.spec("F5")
def test_it_refuses_a_33rd_kind() -> None:
    text = BASE.format(name="a", failures=_failures(*(_kind(f"kind_{i}") for i in range(33))))
    problem = _one(text)
    assert problem.field == "failures" and "33 kinds" in problem.message and "at most 32" in problem.message
    assert _errors(BASE.format(name="a", failures=_failures(*(_kind(f"kind_{i}") for i in range(32))))) == []


@pytest.mark.spec("F2")
def test_it_refuses_flags_that_are_not_booleans() -> None:
    problem = _one(BASE.format(name="a", failures=_kind("gone") + "    retryable: maybe\n"))
    assert problem.field == "failures[0].retryable"


def test_it_lists_every_error_at_once() -> None:
    text = "name: Bad Name\ntools: [oz.nope]\napproval: {mode: sometimes}\ncolour: blue\n"
    fields = {p.field for p in _errors(text)}
    assert fields == {"name", "model", "tools[0]", "approval.mode", "colour"}


def test_it_refuses_text_that_is_not_a_mapping() -> None:
    assert _one("- a\n- b\n").field == "manifest"
    assert _one("name: [unclosed\n").message.startswith("is not valid YAML")
    assert _one("").field == "manifest"


@pytest.mark.spec("F6", "F8")
def test_it_warns_about_failures_without_oz_fail_and_oz_fail_without_failures() -> None:
    no_tool = lint("name: a\nmodel: script\ntools: [test.echo]\nfailures:\n" + _kind("gone"))
    assert no_tool.errors == [] and [w.field for w in no_tool.warnings] == ["failures"]
    assert "oz.fail" in no_tool.warnings[0].message and no_tool.warnings[0].line == 4
    no_kinds = lint("name: a\nmodel: script\ntools: [oz.fail]\n")
    assert no_kinds.errors == [] and [w.field for w in no_kinds.warnings] == ["tools"]
    assert lint(BASE.format(name="a", failures=_kind("gone"))).warnings == []


@pytest.mark.django_db
def test_it_makes_a_new_version_only_when_the_manifest_changes() -> None:
    from tests.factories import make_workspace

    name = "versioned_agent"
    workspace = make_workspace()
    first = register(BASE.format(name=name, failures=_kind("gone")), workspace=workspace)
    again = register("# a comment changes nothing\n" + BASE.format(name=name, failures=_kind("gone")), workspace=workspace)
    changed = register(BASE.format(name=name, failures=_kind("gone", "Now described otherwise")), workspace=workspace)
    assert (first.version.version, first.created) == (1, True)
    assert (again.version.pk, again.created) == (first.version.pk, False)
    assert (changed.version.version, changed.created) == (2, True)
    assert AgentVersion.objects.filter(agent__name=name).count() == 2


@pytest.mark.django_db
def test_it_registers_nothing_for_an_invalid_manifest() -> None:
    from tests.factories import make_workspace

    with pytest.raises(InvalidManifest) as info:
        register(BASE.format(name="broken_agent", failures=_kind("timeout")), workspace=make_workspace())
    assert info.value.linted.errors[0].field == "failures[0].kind"
    assert not AgentVersion.objects.filter(agent__name="broken_agent").exists()


def test_it_keeps_the_example_agents_lint_clean() -> None:
    from tests.conftest import ROOT

    found: dict[str, Any] = {}
    for path in sorted((ROOT / "oz0agents" / "examples").glob("*.yaml")):
        linted = lint(path.read_text())
        found[path.name] = (linted.errors, linted.warnings)
    assert len(found) >= 2
    assert all(errors == [] and warnings == [] for errors, warnings in found.values()), found


# ---- tools nobody serves yet (warnings) and tools nobody ever will (errors) ----


@pytest.mark.spec("F8")
def test_it_warns_rather_than_errs_about_a_tool_a_runner_may_serve_later() -> None:
    linted = lint("name: tracker\nmodel: script\ntools:\n  - test.echo\n  - github.get_issue\n")
    assert linted.errors == []
    assert [(w.line, w.field) for w in linted.warnings] == [(5, "tools[1]")]
    assert "github.get_issue" in linted.warnings[0].message and "runner" in linted.warnings[0].message
    assert linted.manifest is not None and linted.manifest["tools"] == ["test.echo", "github.get_issue"]


def test_it_registers_a_manifest_whose_tool_is_not_installed_yet_with_its_warning(db: Any) -> None:
    from tests.factories import make_workspace

    registered = register("name: tracker-later\nmodel: script\ntools: [github.get_issue]\n", workspace=make_workspace())
    assert registered.created and registered.version.manifest["tools"] == ["github.get_issue"]
    assert [w.field for w in registered.warnings] == ["tools[0]"]


def test_it_errs_about_a_tool_known_to_be_unserved(settings: Any) -> None:
    problem = _one("name: a\nmodel: script\ntools: [oz.nope]\n")
    assert (problem.line, problem.field) == (3, "tools[0]") and "built-ins" in problem.message
    settings.OZ0_TEST_TOOLS = False
    problem = _one("name: a\nmodel: script\ntools:\n  - clock.now\n  - test.echo\n")
    assert (problem.line, problem.field) == (5, "tools[1]") and "OZ0_TEST_TOOLS" in problem.message


# ---- what the YAML parser is allowed to cost, and what JSON can hold ----


def _laughs(levels: int) -> str:
    """The billion laughs: each level nine aliases of the one before (9**levels strings)."""
    rows = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, levels):
        rows.append(f"l{level}: &l{level} [" + ",".join([f"*l{level - 1}"] * 9) + "]")
    return "name: bomb\nmodel: script\nscript:\n" + "".join(f"  {row}\n" for row in rows)


def test_it_refuses_anchors_and_aliases_with_their_line() -> None:
    text = "name: a\nmodel: script\nscript: &answers\n  - {text: hi}\ninstructions: *answers\n"
    problem = _one(text)
    assert (problem.line, problem.field) == (3, "manifest") and "anchor or alias" in problem.message


def test_it_refuses_a_yaml_alias_bomb_before_expanding_it() -> None:
    text = _laughs(9)
    assert len(text.encode()) < 1000
    problem = _one(text)
    assert problem.line == 4 and "anchor or alias" in problem.message


def test_it_refuses_a_manifest_over_256_kib() -> None:
    text = "name: big\nmodel: script\ninstructions: |\n" + "  words words words\n" * (256 * 1024 // 20 + 1)
    assert len(text.encode()) > 256 * 1024
    problem = _one(text)
    assert problem.line == 1 and "at most 262,144" in problem.message


@pytest.mark.parametrize(
    "value,line,words",
    [
        ("2024-01-01", 4, "a date or time"),
        ("2024-01-01T10:00:00Z", 4, "a date or time"),
        ("!!binary aGVsbG8=", 4, "binary data"),
        ('"nul \\0 inside"', 4, "NUL"),
        (".inf", 4, "not a finite number"),
        ("!!set {a, b}", 4, "a set"),
        ("!custom thing", 4, "`!custom`"),
    ],
)
def test_it_refuses_yaml_values_json_cannot_hold_with_their_line(value: str, line: int, words: str) -> None:
    text = f"name: a\nmodel: script\nscript:\n  - text: {value}\n"
    problem = _one(text)
    assert problem.line == line and words in problem.message, problem


def test_it_refuses_more_values_than_a_manifest_needs_before_building_them() -> None:
    text = "name: a\nmodel: script\nscript: [" + ",".join(["1"] * (NODES_MAX + 1)) + "]\n"
    problem = _one(text)
    assert problem.line == 3 and "more than 20,000 values" in problem.message


def test_it_refuses_nesting_deeper_than_a_manifest_needs() -> None:
    problem = _one("name: a\nmodel: script\nscript: " + "[" * 50 + "]" * 50 + "\n")
    assert problem.line == 3 and "nests deeper than 32 levels" in problem.message
    # Deeper still, the YAML parser itself says so first: a typed error all the same.
    problem = _one("name: a\nmodel: script\nscript: " + "[" * 5000 + "]" * 5000 + "\n")
    assert problem.line == 3 and "nest" in problem.message


def test_it_registers_nothing_for_yaml_json_cannot_hold(db: Any) -> None:
    from tests.factories import make_workspace

    workspace = make_workspace()
    before = AgentVersion.objects.count()
    for text in (
        "name: dated\nmodel: script\nscript: [{text: 2024-01-01}]\n",
        'name: nul\nmodel: script\ndescription: "a\\0b"\n',
    ):
        with pytest.raises(InvalidManifest):
            register(text, workspace=workspace)
    assert AgentVersion.objects.count() == before
