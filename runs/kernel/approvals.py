"""What an approval is bound to, and the rules that decide a call without a person (S5, S6).

Pure: no database, no transaction. An approval is bound to the call's digest, the SHA-256 of the
canonical JSON of its tool name and arguments, so the call that runs is exactly the call a person
(or a rule) saw; `runs.kernel.scheduling`'s gate checks it when the call starts and again when a
worker or a runner claims it.

A rule is `{tool: glob, decision: allow|deny, when: {args.<path>: {matcher: value}}, name: text}`;
`when` and `name` are optional. The matchers are data, never evaluated: `equals` (a scalar),
`prefix` (text), `one_of` (a list of scalars). Every matcher of every condition must hold; an
argument the call does not have matches nothing.

A child run (a delegate, an Ask agent, a quarantine, a flow step) carries its ancestors' modes as
`inherited` layers beside its own, nearest first, and each call is decided by the strictest of
them (`call_decision`): a denial beats a person, a person beats an allow.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

MATCHERS = ("equals", "prefix", "one_of")
RULE_FIELDS = frozenset({"tool", "decision", "when", "name"})
DECISIONS = ("allow", "deny")
MAX_CONDITIONS = 16
MAX_PATH_DEPTH = 8
MAX_ONE_OF = 100
MAX_TEXT = 1000
MAX_NAME = 100
PATH_SEGMENT = re.compile(r"[A-Za-z0-9_\-]{1,100}")

# A problem with a rule: the path inside the rule it is about (for a line number), and what is wrong.
RuleProblem = tuple[tuple[str, ...], str]


def call_digest(tool: Any, args: Any) -> str:
    """The SHA-256 (hex) of the canonical JSON of {"args": ..., "tool": ...}: sorted keys, no
    spaces, UTF-8. Two calls share a digest exactly when they name the same tool with equal args."""
    canonical = json.dumps(
        {"args": {} if args is None else args, "tool": tool}, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def spec_digest(spec: Mapping[str, Any]) -> str:
    """The digest of a tool task's call as its row stands."""
    return call_digest(spec.get("tool"), spec.get("args"))


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | bool | int | float)


def rule_problems(rule: Any) -> list[RuleProblem]:
    """What is wrong with one rule, each with the path inside the rule it is about; [] when sound."""
    if not isinstance(rule, Mapping):
        return [((), "must be {tool: <name or glob>, decision: allow|deny, when: {...}, name: ...}")]
    problems: list[RuleProblem] = []
    unknown = set(rule) - RULE_FIELDS
    if unknown:
        problems.append(
            ((), f"has unknown field(s) {', '.join(sorted(map(str, unknown)))}; a rule has tool, decision, when, name")
        )
    tool = rule.get("tool")
    if not isinstance(tool, str) or not tool or len(tool) > 200:
        problems.append((("tool",), "must name a tool or a glob such as `test.*`"))
    if rule.get("decision") not in DECISIONS:
        problems.append((("decision",), f"must be one of {', '.join(DECISIONS)}"))
    name = rule.get("name")
    if name is not None and (not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME):
        problems.append((("name",), f"must be a short text naming the rule (at most {MAX_NAME} characters)"))
    if "when" in rule:
        problems.extend(_when_problems(rule["when"]))
    return problems


def problem_field(path: Sequence[str]) -> str:
    """A problem's path as it reads after `approval.rules[i]`: `.when[args.path].prefix`."""
    text = ""
    for index, part in enumerate(path):
        text += f"[{part}]" if index == 1 and path[0] == "when" else f".{part}"
    return text


def _when_problems(when: Any) -> list[RuleProblem]:
    if not isinstance(when, Mapping) or not when:
        return [(("when",), "must map argument paths to matchers, e.g. {args.path: {prefix: /tmp/}}")]
    if len(when) > MAX_CONDITIONS:
        return [(("when",), f"has {len(when)} conditions; at most {MAX_CONDITIONS}")]
    problems: list[RuleProblem] = []
    for path, matcher in when.items():
        where = ("when", str(path))
        if _path_segments(path) is None:
            problems.append(
                (where, f"must be a path into the call's arguments such as `args.path` (at most {MAX_PATH_DEPTH} names)")
            )
            continue
        if not isinstance(matcher, Mapping) or not matcher:
            problems.append((where, "must be a matcher: {equals: ...}, {prefix: ...} or {one_of: [...]}"))
            continue
        for op, value in matcher.items():
            problem = _matcher_problem(op, value)
            if problem is not None:
                problems.append(((*where, str(op)), problem))
    return problems


def _matcher_problem(op: Any, value: Any) -> str | None:
    if op not in MATCHERS:
        return f"is not a matcher; use one of {', '.join(MATCHERS)}"
    if op == "equals" and not (_is_scalar(value) and (not isinstance(value, str) or len(value) <= MAX_TEXT)):
        return "must be a text, number, true, false or null"
    if op == "prefix" and not (isinstance(value, str) and value and len(value) <= MAX_TEXT):
        return f"must be a non-empty text (at most {MAX_TEXT} characters)"
    if op == "one_of":
        if not isinstance(value, list) or not value or len(value) > MAX_ONE_OF:
            return f"must be a list of 1 to {MAX_ONE_OF} values"
        if not all(_is_scalar(v) and (not isinstance(v, str) or len(v) <= MAX_TEXT) for v in value):
            return "must list texts, numbers, true, false or null"
    return None


def _path_segments(path: Any) -> list[str] | None:
    if not isinstance(path, str):
        return None
    head, _, rest = path.partition(".")
    if head != "args" or not rest:
        return None
    segments = rest.split(".")
    if len(segments) > MAX_PATH_DEPTH or not all(PATH_SEGMENT.fullmatch(s) for s in segments):
        return None
    return segments


_MISSING = object()


def _argument(args: Any, segments: Sequence[str]) -> Any:
    value = args
    for segment in segments:
        if not isinstance(value, Mapping) or segment not in value:
            return _MISSING
        value = value[segment]
    return value


def _same(a: Any, b: Any) -> bool:
    # JSON equality: true is not 1, and a text is never a number.
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    return bool(a == b)


def _climbs(text: str) -> bool:
    """A `..` segment could climb out of any prefix (`/tmp/../etc`): such a value matches none."""
    return ".." in re.split(r"[/\\]", text)


def _holds(op: str, expected: Any, value: Any) -> bool:
    if op == "equals":
        return _is_scalar(value) and _same(value, expected)
    if op == "prefix":
        return isinstance(value, str) and value.startswith(expected) and not _climbs(value)
    if op == "one_of":
        return _is_scalar(value) and any(_same(value, option) for option in expected)
    return False


def rule_matches(rule: Mapping[str, Any], tool: str, args: Any) -> bool:
    if not fnmatch.fnmatchcase(tool, str(rule.get("tool", ""))):
        return False
    for path, matcher in (rule.get("when") or {}).items():
        segments = _path_segments(path)
        if segments is None:
            return False
        value = _argument(args, segments)
        if value is _MISSING or not all(_holds(op, expected, value) for op, expected in matcher.items()):
            return False
    return True


def deciding_rule(rules: Sequence[Mapping[str, Any]], tool: str, args: Any) -> tuple[str | int, str] | None:
    """The first rule matching the call, as (its name, or its index when unnamed; its decision)."""
    for index, rule in enumerate(rules):
        if rule_matches(rule, tool, args):
            return rule.get("name") or index, str(rule["decision"])
    return None


# How strict each decision is: a rule's denial, then a person (ask, or rules no rule decides),
# then an allow (bypass, or an allowing rule).
_STRICTNESS = {"deny": 2, None: 1, "allow": 0}


def _layer_decision(layer: Mapping[str, Any], tool: str, args: Any) -> tuple[str | None, dict[str, Any]]:
    mode = str(layer.get("mode", "ask"))
    if mode == "bypass":
        return "allow", {"by": "bypass"}
    if mode == "rules":
        decided = deciding_rule(layer.get("rules") or [], tool, args)
        if decided is not None:
            rule, decision = decided
            return decision, {"by": "rules", "rule": rule}
        return None, {"by": "rules"}
    return None, {"by": "ask"}


def call_decision(approval: Mapping[str, Any], tool: str, args: Any) -> tuple[str | None, dict[str, Any]]:
    """A model-composed call's decision under a run's approval: `allow`, `deny`, or None (a person
    decides), and who decided (`by`: the mode, `rule`: the rule that decided).

    A child run's `approval` holds its own mode and rules and, under `inherited`, its ancestors'
    (nearest first, each with its `run` and `agent`): the strictest decision wins, the nearest
    layer breaking a tie, so a child never runs what its parent's mode would have stopped. For a
    child run, `mode_of` says whose mode decided: `own`, `parent`, or an `ancestor` further up
    (with that run and its agent)."""
    inherited = list(approval.get("inherited") or [])
    best: tuple[str | None, dict[str, Any]] | None = None
    for depth, layer in enumerate([approval, *inherited]):
        decision, who = _layer_decision(layer, tool, args)
        if inherited:
            who["mode_of"] = ("own", "parent")[depth] if depth < 2 else "ancestor"
            if depth:
                who.update(run=layer.get("run"), agent=layer.get("agent"))
        if best is None or _STRICTNESS[decision] > _STRICTNESS[best[0]]:
            best = (decision, who)
    assert best is not None
    return best


def inherited_layers(parent_id: Any, parent_agent: Any, parent_approval: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What a child run inherits from its parent: the parent's own mode and rules, then what the
    parent inherited, nearest first."""
    own = {
        "run": str(parent_id),
        "agent": parent_agent or None,
        "mode": parent_approval.get("mode", "ask"),
        "rules": list(parent_approval.get("rules") or []),
    }
    return [own, *(dict(layer) for layer in parent_approval.get("inherited") or [])]
