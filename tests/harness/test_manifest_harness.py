"""The manifest's `harness:` field (F7): validated and linted with line numbers like the rest of the
manifest, normalized for the worker; the F8 warnings still apply to a harnessed agent."""

from __future__ import annotations

import textwrap

import pytest

from agents.lint import lint


def _lint(text: str):  # type: ignore[no-untyped-def]
    return lint(textwrap.dedent(text))


@pytest.mark.spec("F7")
def test_it_normalizes_each_harness_kind() -> None:
    cases = {
        "harness: oz0": None,
        'harness: {pydantic_ai: "my_agents.issues:agent"}': {"kind": "pydantic_ai", "target": "my_agents.issues:agent"},
        'harness: {openai_agents: "pkg.mod:triage.agent"}': {"kind": "openai_agents", "target": "pkg.mod:triage.agent"},
        "harness: {acp: {command: [my-agent, --acp], env: {MODE: fast}}}": {
            "kind": "acp",
            "command": ["my-agent", "--acp"],
            "env": {"MODE": "fast"},
        },
        "harness: {jsonl: {command: [python, agent.py]}}": {"kind": "jsonl", "command": ["python", "agent.py"], "env": {}},
    }
    for line, expected in cases.items():
        linted = lint(f"name: a\nmodel: script\n{line}\ntools: [test.echo]\n")
        assert linted.errors == [], (line, linted.errors)
        assert linted.manifest is not None and linted.manifest.get("harness") == expected, line
        if expected is None:
            assert "harness" not in linted.manifest


@pytest.mark.spec("F7")
def test_a_harnessed_agent_needs_no_model_and_an_unharnessed_one_still_does() -> None:
    linted = lint("name: a\nharness: {jsonl: {command: [x]}}\n")
    assert linted.ok and linted.manifest is not None and linted.manifest["model"] == "harness:jsonl"
    assert [e.field for e in lint("name: a\nharness: oz0\n").errors] == ["model"]


@pytest.mark.spec("F7", "F8")
def test_it_refuses_bad_harnesses_with_their_lines() -> None:
    text = """\
        name: a
        model: script
        harness:
          jsonl:
            command:
              - python
              - 7
            env: {GOOD: yes, 1BAD: x}
        """
    errors = _lint(text).errors
    assert [(e.line, e.field) for e in errors] == [
        (7, "harness.jsonl.command[1]"),
        (8, "harness.jsonl.env.GOOD"),
        (8, "harness.jsonl.env"),
    ]
    for text, line, field, words in [
        ("name: a\nmodel: script\nharness: langchain\n", 3, "harness", "not a harness"),
        ("name: a\nmodel: script\nharness:\n  crewai: x\n", 4, "harness", "not a harness kind"),
        ("name: a\nmodel: script\nharness: {pydantic_ai: not-a-target}\n", 3, "harness.pydantic_ai", "package.module:attribute"),
        ("name: a\nmodel: script\nharness: {jsonl: {command: []}}\n", 3, "harness.jsonl.command", "1 to 64"),
        ("name: a\nmodel: script\nharness: {jsonl: {command: [x], cwd: /}}\n", 3, "harness.jsonl", "unknown field"),
        ("name: a\nmodel: script\nharness: {jsonl: {command: [x]}, acp: {command: [y]}}\n", 3, "harness", "exactly one"),
    ]:
        errors = lint(text).errors
        assert len(errors) == 1, (text, errors)
        assert (errors[0].line, errors[0].field) == (line, field) and words in errors[0].message, (text, errors[0])


@pytest.mark.spec("F7", "F8")
def test_the_f8_warnings_still_apply_to_a_harnessed_agent() -> None:
    no_fail = _lint(
        """\
        name: a
        harness: {jsonl: {command: [x]}}
        tools: [test.echo]
        failures:
          - {kind: not_found, description: gone}
        """
    )
    assert no_fail.ok and [(w.line, w.field) for w in no_fail.warnings] == [(4, "failures")]
    no_kinds = _lint(
        """\
        name: a
        harness: {pydantic_ai: "pkg.mod:agent"}
        tools: [oz.fail]
        """
    )
    assert no_kinds.ok and [(w.line, w.field) for w in no_kinds.warnings] == [(3, "tools")]
