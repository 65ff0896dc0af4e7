"""A flow step's `when:` guard (F17): a small expression language, parsed by a whitelisted
recursive-descent parser and evaluated over plain data. Never `eval`: only what the grammar names
can be said, and a guard reads nothing but the steps it names.

    expr    := and ("or" and)*
    and     := not ("and" not)*
    not     := "not" not | compare
    compare := operand (("==" | "!=" | "<" | "<=" | ">" | ">=" | "in") operand)?
    operand := "(" expr ")" | literal | path
    literal := 'text' | "text" | number | true | false | null
    path    := steps.<step id>.(output | failure | status)(.<name>)*

Pure: no database; the kernel evaluates a guard under the run's lock, lint checks it with line numbers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

GUARD_MAX = 500
# Parentheses and `not`s nest at most this deep: the parser recurses, and a guard is never a stack-overflow.
NESTING_MAX = 32
STEP_FIELDS = ("output", "failure", "status")
COMPARISONS = ("==", "!=", "<=", ">=", "<", ">", "in")
TOKEN = re.compile(
    r"\s*(?:(?P<number>-?\d+(?:\.\d+)?)|(?P<string>'[^'\\]*'|\"[^\"\\]*\")|(?P<op>==|!=|<=|>=|<|>|\(|\)|\.)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_\-]*))"
)
KEYWORDS = {"and", "or", "not", "in", "true", "false", "null"}


class GuardError(ValueError):
    """A guard the grammar does not allow; its message says where."""


Node = tuple[Any, ...]


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    position = 0
    while position < len(text):
        if text[position:].strip() == "":
            break
        match = TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise GuardError(f"unexpected {text[position:].strip()[:20]!r} at character {position + 1}")
        kind = match.lastgroup or ""
        tokens.append((kind, match.group(kind)))
        position = match.end()
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.index = 0
        self.depth = 0

    def nest(self) -> None:
        self.depth += 1
        if self.depth > NESTING_MAX:
            raise GuardError(f"the guard nests deeper than {NESTING_MAX} levels")

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            raise GuardError(f"the guard ends where {value or 'more'!r} was expected")
        if value is not None and token[1] != value:
            raise GuardError(f"expected {value!r}, found {token[1]!r}")
        self.index += 1
        return token

    def expression(self) -> Node:
        node = self.conjunction()
        while self.peek() == ("name", "or"):
            self.take()
            node = ("or", node, self.conjunction())
        return node

    def conjunction(self) -> Node:
        node = self.negation()
        while self.peek() == ("name", "and"):
            self.take()
            node = ("and", node, self.negation())
        return node

    def negation(self) -> Node:
        if self.peek() == ("name", "not"):
            self.take()
            self.nest()
            return ("not", self.negation())
        return self.comparison()

    def comparison(self) -> Node:
        left = self.operand()
        token = self.peek()
        if token is not None and token[1] in COMPARISONS:
            self.take()
            return ("compare", token[1], left, self.operand())
        return left

    def operand(self) -> Node:
        kind, value = self.take()
        if value == "(":
            self.nest()
            node = self.expression()
            self.take(")")
            return node
        if kind == "number":
            return ("literal", float(value) if "." in value else int(value))
        if kind == "string":
            return ("literal", value[1:-1])
        if kind == "name" and value in ("true", "false", "null"):
            return ("literal", {"true": True, "false": False, "null": None}[value])
        if kind == "name" and value == "steps":
            return self.path()
        raise GuardError(f"{value!r} is not a value: use steps.<id>.output|failure|status, text, a number, true, false or null")

    def path(self) -> Node:
        self.take(".")
        kind, step = self.take()
        if kind != "name" or step in KEYWORDS:
            raise GuardError(f"{step!r} is not a step id")
        self.take(".")
        _, field = self.take()
        if field not in STEP_FIELDS:
            raise GuardError(f"steps.{step}.{field}: a step gives only {', '.join(STEP_FIELDS)}")
        names: list[str] = []
        while self.peek() == ("op", "."):
            self.take()
            kind, name = self.take()
            if kind != "name" or name in KEYWORDS:
                raise GuardError(f"{name!r} is not a field name")
            names.append(name)
        return ("path", step, field, tuple(names))


def parse_guard(text: Any) -> Node:
    """The guard's tree; GuardError when the text is not a guard."""
    if not isinstance(text, str) or not text.strip():
        raise GuardError("a guard is a non-empty expression")
    if len(text) > GUARD_MAX:
        raise GuardError(f"a guard is at most {GUARD_MAX} characters")
    parser = _Parser(text)
    node = parser.expression()
    if parser.peek() is not None:
        raise GuardError(f"unexpected {parser.peek()[1]!r} after a complete expression")  # type: ignore[index]
    return node


def guard_steps(node: Node) -> set[str]:
    """The step ids a guard reads."""
    return {path[1] for path in guard_paths(node)}


def guard_paths(node: Node) -> list[Node]:
    """The `steps.<id>.<field>...` paths a guard reads, each `("path", id, field, names)`."""
    if node[0] == "path":
        return [node]
    return [path for child in node[1:] if isinstance(child, tuple) for path in guard_paths(child)]


def evaluate_guard(node: Node, steps: Mapping[str, Mapping[str, Any]]) -> Any:
    """The guard's value over `steps` ({id: {output, failure, status}}); a missing field is null."""
    head = node[0]
    if head == "literal":
        return node[1]
    if head == "path":
        value: Any = (steps.get(node[1]) or {}).get(node[2])
        for name in node[3]:
            value = value.get(name) if isinstance(value, Mapping) else None
        return value
    if head == "not":
        return not evaluate_guard(node[1], steps)
    if head == "and":
        return bool(evaluate_guard(node[1], steps)) and bool(evaluate_guard(node[2], steps))
    if head == "or":
        return bool(evaluate_guard(node[1], steps)) or bool(evaluate_guard(node[2], steps))
    operator, left, right = node[1], evaluate_guard(node[2], steps), evaluate_guard(node[3], steps)
    if operator == "==":
        return left == right
    if operator == "!=":
        return left != right
    try:
        if operator == "in":
            return isinstance(right, list | str | Mapping) and left in right
        return {"<": left < right, "<=": left <= right, ">": left > right, ">=": left >= right}[operator]
    except TypeError:
        return False  # values that do not order (text against a number, null) make the comparison false
