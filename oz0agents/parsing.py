"""A manifest's text → its JSON-storable document and the line each part sits on.

This is the reading half of a manifest: what YAML the loader accepts at all (a size cap, no
anchors or aliases, bounded nesting and values, only what JSON holds). The manifest's field
rules (F2-F8) are `oz0agents.lint`, which reads the document parsed here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

MANIFEST_MAX_BYTES = 256 * 1024
MAX_DEPTH = 32
NODES_MAX = 20_000


@dataclass(frozen=True)
class Problem:
    line: int
    field: str
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"line": self.line, "field": self.field, "message": self.message}

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class Unparsable(Exception):
    """Text that is no manifest document: every problem found, each with its line."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("; ".join(map(str, problems)))
        self.problems = problems


class _Refused(Exception):
    """A manifest the loader stops reading at once: an alias, nesting too deep, too many values."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.problem = Problem(line, "manifest", message)


# libyaml when the machine has it (about four times faster); the same events and marks either way.
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_OPENS = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSES = (yaml.SequenceEndEvent, yaml.MappingEndEvent)
_NODES = (yaml.ScalarEvent, *_OPENS)


def _check_events(text: str) -> None:
    """Read the event stream once before anything is composed, refusing anchors and aliases (an
    alias graph of a few hundred bytes expands to gigabytes when walked), nesting deeper than
    MAX_DEPTH (the composer recurses) and more than NODES_MAX nodes (each costs time to build)."""
    depth = nodes = 0
    for event in yaml.parse(text, Loader=_Loader):
        line = event.start_mark.line + 1 if event.start_mark is not None else 1
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _Refused(
                line, "uses a YAML anchor or alias (`&name` / `*name`); manifests refuse them: write the value out in full"
            )
        if isinstance(event, _NODES):
            nodes += 1
            if nodes > NODES_MAX:
                raise _Refused(line, f"holds more than {NODES_MAX:,} values")
        if isinstance(event, _OPENS):
            depth += 1
            if depth > MAX_DEPTH:
                raise _Refused(line, f"nests deeper than {MAX_DEPTH} levels")
        elif isinstance(event, _CLOSES):
            depth -= 1


# The YAML types JSON holds; anything else (dates, binary, sets, custom tags) cannot be stored.
_JSON_TAGS = {"tag:yaml.org,2002:" + name: name for name in ("str", "int", "float", "bool", "null", "seq", "map")}
_TAG_WORDS = {"timestamp": "a date or time", "binary": "binary data", "set": "a set", "omap": "an ordered map", "pairs": "pairs"}
_INT_DIGITS_MAX = 1000


def _json_problems(root: yaml.Node) -> list[Problem]:
    """Every value of the node graph that JSON (and so the row store) cannot hold, with its line."""
    problems: list[Problem] = []
    stack: list[yaml.Node] = [root]
    while stack:
        node = stack.pop()
        line = node.start_mark.line + 1
        tag = node.tag or ""
        if tag not in _JSON_TAGS:
            name = tag.rsplit(":", 1)[-1]
            what = _TAG_WORDS.get(name, f"a `{tag}` value")
            problems.append(Problem(line, "manifest", f"holds {what}, which JSON cannot hold: quote it to make it text"))
            continue
        if isinstance(node, yaml.ScalarNode):
            value = str(node.value)
            if "\x00" in value:
                problems.append(Problem(line, "manifest", "holds a NUL character, which the row store cannot hold"))
            elif _JSON_TAGS[tag] == "float" and value.lower().lstrip("+-") in (".inf", ".nan"):
                problems.append(Problem(line, "manifest", f"holds {value}, which is not a finite number"))
            elif _JSON_TAGS[tag] == "int" and len(value) > _INT_DIGITS_MAX:
                problems.append(
                    Problem(line, "manifest", f"holds a number of {len(value):,} digits; at most {_INT_DIGITS_MAX:,}")
                )
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(reversed(node.value))
        elif isinstance(node, yaml.MappingNode):
            for key_node, value_node in reversed(node.value):
                stack.extend((value_node, key_node))
    problems.sort(key=lambda problem: problem.line)
    return problems


def _load(text: str) -> tuple[Any, yaml.Node | None]:
    """The manifest's data and its node graph (for line numbers). Raises `_Refused`, `Unparsable`
    or YAMLError."""
    _check_events(text)
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        problems = _json_problems(node)
        if problems:
            raise Unparsable(problems)
        return loader.construct_document(node), node
    finally:
        loader.dispose()


class Lines:
    """Line numbers (1-based) of each mapping key and sequence item, by path."""

    def __init__(self, node: yaml.Node | None) -> None:
        self.lines: dict[tuple[Any, ...], int] = {}
        if node is not None:
            self._walk(node, ())

    def _walk(self, node: yaml.Node, path: tuple[Any, ...]) -> None:
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = key_node.value
                self.lines[(*path, key)] = key_node.start_mark.line + 1
                self._walk(value_node, (*path, key))
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                self.lines[(*path, index)] = item.start_mark.line + 1
                self._walk(item, (*path, index))

    def at(self, *path: Any) -> int:
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get((), 1)


@dataclass(frozen=True)
class Document:
    data: Any
    lines: Lines


def parse(text: Any) -> Document:
    """The manifest's document, or `Unparsable` naming every problem that stops it being read."""
    if not isinstance(text, str) or not text.strip():
        raise Unparsable([Problem(1, "manifest", "is empty: a manifest is a YAML mapping with at least `name` and `model`")])
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MANIFEST_MAX_BYTES:
        raise Unparsable([Problem(1, "manifest", f"is {size:,} bytes; a manifest is at most {MANIFEST_MAX_BYTES:,}")])
    try:
        data, node = _load(text)
    except _Refused as refused:
        raise Unparsable([refused.problem]) from None
    except yaml.YAMLError as parse_error:
        mark = getattr(parse_error, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(parse_error, "problem", None) or str(parse_error)
        raise Unparsable([Problem(line, "manifest", f"is not valid YAML: {problem}")]) from None
    return Document(data, Lines(node))
