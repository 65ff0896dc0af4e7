"""The request contract: the envelope's caps, the fields a create, an append and a task may carry
with the JSON Schema fragment of each, and the checks of those fragments. One definition:
compile (runs.kernel.compile) checks each field against these fragments, and
`create_body_schema` / `append_body_schema` assemble the same fragments into the OpenAPI
document's request bodies."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from runs.kernel.approvals import DECISIONS, MAX_CONDITIONS, MAX_NAME
from runs.kernel.errors import InvalidRequest

MAX_STEPS_PER_REQUEST = 64
MAX_FAN = 32
MAX_READS = 33
MAX_PAYLOAD_BYTES = 1024 * 1024
# The entry count is corruption protection, never a wall (S30): the smallest JSON entry takes
# two bytes (`0,`), so no body under the byte cap can reach this count.
MAX_ENTRIES = MAX_PAYLOAD_BYTES // 2
# Deeper JSON than any tool's arguments need, and shallow enough for every recursive reader
# downstream (Python's json, pydantic, PostgreSQL's jsonb parser).
MAX_DEPTH = 100
# A clock (an await's, a tool call's) becomes a deadline (a datetime): a year and a day covers
# any real wait and keeps the arithmetic far from datetime's and PostgreSQL's ends.
MAX_TIMEOUT_SECONDS = 366 * 24 * 3600
KEY_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,199}$")
KINDS = ("tool", "round", "await", "join", "delegate")
POLICIES = ("propagate", "absorb", "halt")
APPROVAL_MODES = ("bypass", "ask", "rules")
MAX_APPROVAL_RULES = 100
JOIN_MODES = ("all", "any", "quorum")
MAX_RETRY_BUDGET = 100

# ---- the request contract: what compile accepts, and the JSON Schema the OpenAPI document shows ----
# One definition: compile checks each field against these fragments (`check_fields`), and
# `create_body_schema` / `append_body_schema` assemble the same fragments into the document's
# request bodies. A new request field goes here (and, if it means more than its type, into the
# compile function that reads it).
_NULL = {"type": "null"}
# A task's fields besides key, kind, after and on_failure: each may be absent or null, and has the
# type below whatever the task's kind; what each means for its kind is `_kind_spec`'s to check.
TASK_FIELDS: dict[str, dict[str, Any]] = {
    "tool": {"type": "string"},
    "args": {"type": "object"},
    "model": {"type": "string"},
    "fallback_models": {"type": "array", "items": {"type": "string"}},
    "prompt": {"type": "string"},
    "tools": {"type": "array", "items": {"type": "string"}},
    "script": {"type": ["array", "object"]},
    "question": {"type": "string"},
    "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_TIMEOUT_SECONDS},
    "mode": {"enum": list(JOIN_MODES)},
    "quorum": {"type": "integer", "minimum": 1},
    # delegate: a child run of `agent` with `input`, read as `via` says (F14-F16).
    "agent": {"type": "string", "minLength": 1},
    "input": {},
    "via": {"enum": ["delegate", "ask", "flow", "quarantine"]},
    "output_schema": {"type": "object"},
    # a guard over settled sources (F17): `steps.<key>.output|failure|status ...`; false skips the task
    "when": {"type": "string"},
}
APPROVAL_RULE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["tool", "decision"],
    "properties": {
        "tool": {"type": "string", "minLength": 1, "maxLength": 200},
        "decision": {"enum": list(DECISIONS)},
        # {"args.<path>": {"equals"|"prefix"|"one_of": value}}: checked by runs.kernel.approvals.
        "when": {"type": "object", "minProperties": 1, "maxProperties": MAX_CONDITIONS},
        "name": {"anyOf": [{"type": "string", "minLength": 1, "maxLength": MAX_NAME}, _NULL]},
    },
}
# A create's fields; any other is refused (`unknown_field`).
CREATE_FIELDS: dict[str, dict[str, Any]] = {
    "agent": {"type": "string", "minLength": 1},
    "input": {},
    "tasks": {"type": "array"},  # each task: TASK_FIELDS (`task_schema`)
    "deliverable": {"type": "string"},
    "approval": {
        "type": "object",
        "properties": {
            "mode": {"enum": list(APPROVAL_MODES)},
            "rules": {"type": "array", "maxItems": MAX_APPROVAL_RULES, "items": APPROVAL_RULE_SCHEMA},
        },
    },
    "retry": {
        "type": "object",
        "properties": {"budget": {"type": "integer", "minimum": 0, "maximum": MAX_RETRY_BUDGET}},
    },
    "private": {"type": "boolean"},
}
APPEND_FIELDS: dict[str, dict[str, Any]] = {"tasks": {"type": "array"}, "deliverable": {"type": "string"}}


def task_schema() -> dict[str, Any]:
    """One task, as the OpenAPI document shows it (fields beyond these are kept, unread)."""
    return {
        "type": "object",
        "required": ["key", "kind"],
        "properties": {
            "key": {"type": "string", "pattern": KEY_PATTERN.pattern},
            "kind": {"enum": list(KINDS)},
            "after": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
            "on_failure": {"enum": list(POLICIES)},
            **{name: {"anyOf": [fragment, _NULL]} if fragment else {} for name, fragment in TASK_FIELDS.items()},
        },
    }


def _task_list_schema() -> dict[str, Any]:
    return {"type": "array", "minItems": 1, "maxItems": MAX_STEPS_PER_REQUEST, "items": task_schema()}


def _body_schema(fields: Mapping[str, dict[str, Any]], title: str, **extra: Any) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    for name, fragment in fields.items():
        if name == "tasks":
            properties[name] = _task_list_schema()
        elif not fragment:
            properties[name] = {}
        else:
            properties[name] = {"anyOf": [fragment, _NULL]}
    return {"title": title, "type": "object", "additionalProperties": False, "properties": properties, **extra}


def create_body_schema() -> dict[str, Any]:
    """A create's body: `tasks` (at least one), or an `agent` whose manifest drives the run."""
    schema = _body_schema(CREATE_FIELDS, "CreateIn")
    schema["properties"]["tasks"] = {"anyOf": [schema["properties"]["tasks"], _NULL]}
    schema["anyOf"] = [
        {"required": ["tasks"], "properties": {"tasks": {"type": "array"}}},
        {"required": ["agent"], "properties": {"agent": {"type": "string"}}},
    ]
    return schema


def append_body_schema() -> dict[str, Any]:
    return _body_schema(APPEND_FIELDS, "AppendIn", required=["tasks"])


def _fits(value: Any, fragment: Mapping[str, Any]) -> bool:
    """Whether `value` has the fragment's type (and enum, item type): the part of a field's
    contract that does not depend on the task's kind."""
    if "enum" in fragment and value not in fragment["enum"]:
        return False
    if not _within(value, fragment):
        return False
    kinds = fragment.get("type")
    if kinds is None:
        return True
    for kind in [kinds] if isinstance(kinds, str) else kinds:
        if kind == "string" and isinstance(value, str):
            return True
        if kind == "object" and isinstance(value, Mapping):
            return True
        if kind == "boolean" and isinstance(value, bool):
            return True
        if kind == "integer" and isinstance(value, int) and not isinstance(value, bool):
            return True
        if kind == "number" and isinstance(value, int | float) and not isinstance(value, bool):
            return True
        if kind == "array" and isinstance(value, list):
            items = fragment.get("items")
            return items is None or all(_fits(item, items) for item in value)
    return False


def _within(value: Any, fragment: Mapping[str, Any]) -> bool:
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in fragment and value < fragment["minimum"]:
            return False
        if "exclusiveMinimum" in fragment and value <= fragment["exclusiveMinimum"]:
            return False
        if "maximum" in fragment and value > fragment["maximum"]:
            return False
    return not (isinstance(value, str) and len(value) < fragment.get("minLength", 0))


def check_fields(raw: Mapping[str, Any], fields: Mapping[str, dict[str, Any]], where: str = "") -> None:
    for name, fragment in fields.items():
        value = raw.get(name)
        if value is not None and fragment and not _fits(value, fragment):
            field_name = f"{where}.{name}" if where else f"`{name}`"
            raise InvalidRequest("invalid_field", f"{field_name} must be {_described(fragment)}")


def _described(fragment: Mapping[str, Any]) -> str:
    if "enum" in fragment:
        return "one of " + ", ".join(map(str, fragment["enum"]))
    kinds = fragment["type"]
    names = {"object": "an object", "array": "a list", "integer": "a whole number", "string": "a text"}
    text = " or ".join(names.get(k, f"a {k}") for k in ([kinds] if isinstance(kinds, str) else kinds))
    bounds = [
        f"{word} {fragment[b]}"
        for b, word in (("minimum", "at least"), ("exclusiveMinimum", "above"), ("maximum", "at most"))
        if b in fragment
    ]
    if fragment.get("minLength"):
        bounds.append("not empty")
    return (
        text
        + (" of texts" if fragment.get("items") == {"type": "string"} else "")
        + (f" ({', '.join(bounds)})" if bounds else "")
    )


def refuse_unknown_fields(body: Mapping[str, Any], fields: Mapping[str, Any]) -> None:
    """Refuse a request's fields its contract does not name: a typo is never ignored silently."""
    unknown = set(body) - set(fields)
    if unknown:
        raise InvalidRequest("unknown_field", f"unknown field(s): {', '.join(sorted(map(str, unknown)))}")
