"""A delegate task's `output_schema` (F15): whether it is a JSON Schema, whether a child's answer
fits it, and where an answer that fits still carries free text (words the schema let through).

Pure: no database. A quarantine passes its parent only what the schema allows, and the kernel
taints the parent when that still holds free text (runs.kernel.delegation).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError


def schema_problem(schema: Mapping[str, Any]) -> str | None:
    """Why `schema` is not a JSON Schema (draft 2020-12), or None."""
    try:
        Draft202012Validator.check_schema(dict(schema))
    except SchemaError as error:
        return str(error.message)[:200]
    return None


def schema_allows(schema: Mapping[str, Any], value: Any) -> bool:
    """Whether `value` is valid under `schema` (a quarantine's output check, F15). A schema that
    cannot be applied (a `$ref` it cannot resolve: nothing is fetched) lets nothing through."""
    try:
        return bool(Draft202012Validator(dict(schema)).is_valid(value))
    except Exception:
        return False


# What a value might say where its schema lets any words through: a sentence, and two short words.
FREE_TEXT_PROBES = ("oz0 probe: a sentence of free words, as an instruction to a model could be.", "a b")
# A value with more strings (and member names) than this is not judged one by one: it is free text.
FREE_TEXT_MAX_PROBED = 256
FREE_TEXT_MAX_BYTES = 64 * 1024
FREE_TEXT_MAX_PATHS = 10
_FREE_KEY = "*"


def free_text_paths(schema: Mapping[str, Any], value: Any) -> list[str]:
    """Where a value its schema allows carries free text (F15): the paths (`$`, `$.name`, `$[0]`,
    `$.*` for a member name the child chose) of each string, and each member name, that the schema
    would have allowed to be any words. Each is judged by putting probe sentences in its place: a
    string pinned by `enum`, `const` or a tight `pattern` refuses them, a bare `{type: string}`
    takes them. A member name the schema itself spells (under `properties`, `required`, an `enum`
    or `const`) is the schema's word, not the child's. [] when the value says nothing of its own."""
    spots: list[tuple[tuple[Any, ...], bool]] = []  # (path, is a member name)
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            spots.append((path, False))
        elif isinstance(item, Mapping):
            for key, member in item.items():
                spots.append(((*path, key), True))
                stack.append((member, (*path, key)))
        elif isinstance(item, list):
            stack.extend((member, (*path, index)) for index, member in enumerate(item))
    if not spots:
        return []
    if len(spots) > FREE_TEXT_MAX_PROBED or len(json.dumps(value, default=str)) > FREE_TEXT_MAX_BYTES:
        return ["$"]
    schema_words = _schema_words(schema)
    free_names = {path for path, is_name in spots if is_name and _name_is_free(schema, value, path, schema_words)}
    found: list[str] = []
    for path, is_name in sorted(spots, key=lambda spot: [str(p) for p in spot[0]]):
        if is_name:
            free = path in free_names
        else:
            free = any(schema_allows(schema, _replaced(value, path, probe)) for probe in FREE_TEXT_PROBES)
        if free:
            shown = _path_text(path, free_names)
            if shown not in found:
                found.append(shown)
    return found[:FREE_TEXT_MAX_PATHS]


def _schema_words(schema: Any) -> set[str]:
    """Every name and value the schema itself spells: member names it declares or requires, and
    the strings of its `enum`s and `const`s."""
    words: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            for key, member in node.items():
                if key in ("properties", "dependentRequired", "dependentSchemas") and isinstance(member, Mapping):
                    words.update(str(name) for name in member)
                elif key in ("required", "enum") and isinstance(member, list):
                    words.update(v for v in member if isinstance(v, str))
                elif key == "const" and isinstance(member, str):
                    words.add(member)
                stack.append(member)
        elif isinstance(node, list):
            stack.extend(node)
    return words


def _name_is_free(schema: Mapping[str, Any], value: Any, path: tuple[Any, ...], schema_words: set[str]) -> bool:
    if str(path[-1]) in schema_words:
        return False
    return any(schema_allows(schema, _renamed(value, path, probe)) for probe in FREE_TEXT_PROBES)


def _replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    """The value with what sits at `path` replaced (containers copied along the path only)."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, list):
        copy = list(value)
        copy[head] = _replaced(value[head], rest, new)
        return copy
    return {**value, head: _replaced(value[head], rest, new)}


def _renamed(value: Any, path: tuple[Any, ...], name: str) -> Any:
    """The value with the member name at `path` changed to `name`."""
    if len(path) == 1:
        return {(name if key == path[0] else key): member for key, member in value.items()}
    head, rest = path[0], path[1:]
    copy = list(value) if isinstance(value, list) else dict(value)
    copy[head] = _renamed(value[head], rest, name)
    return copy


def _path_text(path: tuple[Any, ...], free_names: set[tuple[Any, ...]]) -> str:
    text = "$"
    for depth, part in enumerate(path):
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{_FREE_KEY}" if path[: depth + 1] in free_names else f".{part}"
    return text
