"""A flow step's input templates (F15, F17): `{{ input.<name> }}` and `{{ steps.<id>.output }}`,
`{{ steps.<id>.failure.kind }}`, ... inside the strings of a step's `input`, filled in when the
step's child starts from the flow's input and the settled steps it comes after.

A string that is one template and nothing else takes the value as it is (any JSON); a template
inside a longer string is written in as text (JSON for what is not text). The paths are the
guards' (`runs.kernel.guards`), parsed by the same whitelisted parser, never evaluated as code.

Rendering says which steps' words went in: a step's `output`, or its failure's `message`, are the
words of the agent that ran it, and a template hands them on without the labels a tool's answer
gives them (whose words, failed or not). The kernel marks the flow tainted for that (F15); a
failure's kind, flags, declared, job and a step's status are the platform's facts, not words.

Pure: no database; lint checks templates with line numbers, the kernel renders them under the lock.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from runs.kernel.guards import GuardError, Node, evaluate_guard, guard_paths, parse_guard

TEMPLATE = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
INPUT_PATH = re.compile(r"^input((?:\.[A-Za-z_][A-Za-z0-9_\-]*)*)$")
# A template reads these of a failure without taking anyone's words.
FAILURE_FACTS = frozenset({"kind", "retryable", "partial", "person", "declared", "job"})
TEMPLATES_MAX = 64


class TemplateError(ValueError):
    """A template the grammar does not allow; its message says which."""


def _parse(inner: str) -> Node:
    text = inner.strip()
    found = INPUT_PATH.match(text)
    if found:
        names = tuple(name for name in found.group(1).split(".") if name)
        return ("input", names)
    try:
        node = parse_guard(text)
    except GuardError as bad:
        raise TemplateError(f"{{{{{inner}}}}} is not a template: {bad}") from None
    if node[0] != "path":
        raise TemplateError(f"{{{{{inner}}}}} is not a template: it names input.<name> or steps.<id>.output|failure|status")
    return node


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [text for item in value.values() for text in _strings(item)]
    if isinstance(value, list):
        return [text for item in value for text in _strings(item)]
    return []


def template_paths(value: Any) -> list[Node]:
    """Every template in the strings of `value`, parsed; TemplateError for the first bad one."""
    nodes = [_parse(match.group(1)) for text in _strings(value) for match in TEMPLATE.finditer(text)]
    if len(nodes) > TEMPLATES_MAX:
        raise TemplateError(f"holds {len(nodes)} templates; at most {TEMPLATES_MAX}")
    return nodes


def template_steps(value: Any) -> set[str]:
    """The step ids the templates of `value` read."""
    return {node[1] for node in template_paths(value) if node[0] == "path"}


def has_templates(value: Any) -> bool:
    return any(TEMPLATE.search(text) for text in _strings(value))


def _carries_words(node: Node, value: Any) -> bool:
    if node[0] != "path" or value is None:
        return False
    field, names = node[2], node[3]
    if field == "output":
        return True
    if field == "failure":
        return not names or names[0] not in FAILURE_FACTS
    return False


class _Renderer:
    def __init__(self, run_input: Any, steps: Mapping[str, Mapping[str, Any]]) -> None:
        self.run_input = run_input
        self.steps = steps
        self.words_of: set[str] = set()

    def value_of(self, node: Node) -> Any:
        if node[0] == "input":
            value = self.run_input
            for name in node[1]:
                value = value.get(name) if isinstance(value, Mapping) else None
            return value
        value = evaluate_guard(node, self.steps)
        if _carries_words(node, value):
            self.words_of.add(node[1])
        return value

    def text(self, text: str) -> Any:
        whole = TEMPLATE.fullmatch(text)
        if whole:
            return self.value_of(_parse(whole.group(1)))

        def written(match: re.Match[str]) -> str:
            value = self.value_of(_parse(match.group(1)))
            return value if isinstance(value, str) else json.dumps(value, sort_keys=True)

        return TEMPLATE.sub(written, text)

    def render(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {key: self.render(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.render(item) for item in value]
        return value


def render(value: Any, run_input: Any, steps: Mapping[str, Mapping[str, Any]]) -> tuple[Any, set[str]]:
    """`value` with its templates filled in, and the steps whose words went in (see the module
    docstring). `steps` is the guards' view: {id: {status, output, failure}}."""
    renderer = _Renderer(run_input, steps)
    return renderer.render(value), renderer.words_of


def failures_read(steps: list[Mapping[str, Any]]) -> set[str]:
    """The flow steps whose failure a later step reads (F17): a `when:` guard or an input template on
    `steps.<id>.failure` or `steps.<id>.status`. Such a failure is an error branch's to handle; any
    other step's failure ends the flow with it. A guard or template that does not parse reads nothing
    (lint refuses it before it is stored)."""
    read: set[str] = set()
    for step in steps:
        paths: list[Node] = []
        try:
            if step.get("when") is not None:
                paths.extend(guard_paths(parse_guard(step["when"])))
            if "input" in step:
                paths.extend(template_paths(step["input"]))
        except (GuardError, TemplateError):
            continue
        read.update(path[1] for path in paths if path[0] == "path" and path[2] in ("failure", "status"))
    return read
