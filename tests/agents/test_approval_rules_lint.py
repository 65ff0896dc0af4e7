"""Approval rules in a manifest that match argument values (issue 15, item 5): linted with line
numbers by the kernel's own rule check, carried into the run, and named in the trace."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from oz0agents.lint import lint
from oz0agents.registry import register
from runs import kernel
from runs.models import TraceEvent
from tests.conftest import Team
from tests.runs.driver import drive, statuses

GOOD = textwrap.dedent(
    """\
    name: {name}
    model: script
    tools: [test.echo]
    approval:
      mode: rules
      rules:
        - name: scratch files
          tool: test.echo
          decision: allow
          when:
            args.path: {{prefix: /tmp/}}
        - tool: test.echo
          decision: deny
          when:
            args.path: {{one_of: [/etc/passwd]}}
    script:
      - tool_calls:
          - {{tool: test.echo, args: {{path: /tmp/x}}}}
          - {{tool: test.echo, args: {{path: /etc/passwd}}}}
          - {{tool: test.echo, args: {{path: /srv/y}}}}
      - text: done
    """
)


def test_a_manifest_with_argument_rules_lints_and_keeps_them() -> None:
    linted = lint(GOOD.format(name="rules-ok"))
    assert linted.errors == [], linted.errors
    assert linted.manifest is not None
    rules = linted.manifest["approval"]["rules"]
    assert rules[0] == {
        "name": "scratch files",
        "tool": "test.echo",
        "decision": "allow",
        "when": {"args.path": {"prefix": "/tmp/"}},
    }
    assert rules[1]["when"] == {"args.path": {"one_of": ["/etc/passwd"]}}


BAD = textwrap.dedent(
    """\
    name: rules-bad
    model: script
    tools: [test.echo]
    approval:
      mode: rules
      rules:
        - tool: test.echo
          decision: allow
          when:
            args.path: {regex: "^/tmp/"}
        - tool: test.echo
          decision: allow
          when:
            path: {prefix: /tmp/}
        - tool: test.echo
          decision: deny
          when:
            args.mode:
              one_of: []
        - tool: test.echo
          decision: allow
          when:
            args.size:
              equals: {big: true}
        - tool: test.echo
          decision: allow
          when: "args.path.startswith('/tmp')"
        - tool: test.echo
          decision: allow
          eval: "__import__('os')"
        - tool: test.echo
          decision: allow
          name: 7
    """
)


@pytest.mark.parametrize(
    ("field", "line", "says"),
    [
        ("approval.rules[0].when[args.path].regex", 10, "is not a matcher"),
        ("approval.rules[1].when[path]", 14, "a path into the call's arguments"),
        ("approval.rules[2].when[args.mode].one_of", 19, "a list of 1 to"),
        ("approval.rules[3].when[args.size].equals", 24, "a text, number"),
        ("approval.rules[4].when", 27, "must map argument paths to matchers"),
        ("approval.rules[5]", 28, "unknown field(s) eval"),
        ("approval.rules[6].name", 33, "short text"),
    ],
)
def test_a_bad_matcher_is_an_error_at_its_line(field: str, line: int, says: str) -> None:
    linted = lint(BAD)
    assert linted.manifest is None
    found = {p.field: p for p in linted.errors}
    assert field in found, [p.as_dict() for p in linted.errors]
    assert found[field].line == line and says in found[field].message, found[field]


def test_a_matcher_is_never_evaluated() -> None:
    # An `eval`-looking value is data to compare, never code: it equals only that very text.
    text = GOOD.format(name="rules-data").replace("{prefix: /tmp/}", "{equals: \"__import__('os').system('true')\"}")
    linted = lint(text)
    assert linted.errors == [] and linted.manifest is not None
    rule: dict[str, Any] = linted.manifest["approval"]["rules"][0]
    assert rule["when"] == {"args.path": {"equals": "__import__('os').system('true')"}}


@pytest.mark.spec("S5")
def test_a_registered_agents_argument_rules_decide_its_calls_with_the_rule_named(team: Team) -> None:
    register(GOOD.format(name="rules-run"), team.users["operator"], workspace=team.workspace)
    run, _ = kernel.create_run(workspace=team.workspace, user=team.users["operator"], body={"agent": "rules-run", "input": "go"})
    run = drive(run)
    keys = sorted(k for k in statuses(run) if k.count(".") == 1)
    first, second, third = keys
    states = statuses(run)
    assert states[first] == "completed" and states[second] == "failed" and states[third] == "needs_approval"
    granted = TraceEvent.objects.get(run=run, task_key=first, event="approval_granted")
    denied = TraceEvent.objects.get(run=run, task_key=second, event="approval_denied")
    assert granted.data["rule"] == "scratch files" and denied.data["rule"] == 1
