"""The request contract: the envelope's caps, the fields a create, an append and a task may carry
with the JSON Schema fragment of each, the verbs' and the executors' bodies (`BodyShape`), and the
checks of those fragments. One definition: compile (runs.kernel.compile) checks each field against
these fragments, `read_fields` checks a verb's body against its shape, and `create_body_schema` /
`append_body_schema` / `body_schema` assemble the same fragments into the OpenAPI document's
request bodies."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from runs.kernel.approvals import DECISIONS, MAX_CONDITIONS, MAX_NAME
from runs.kernel.errors import InvalidRequest
from runs.kernel.numbers import whole_number

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
    # 0 (low) to 9 (high), or a name (runs.kernel.priorities); absent: normal, or the parent's.
    "priority": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"enum": ["low", "normal", "high"]}]},
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
    """Whether `value` has the fragment's type (and enum, bounds, pattern, item type, `anyOf`
    alternatives, `not`): the part of a field's contract that does not depend on the task's kind."""
    if "anyOf" in fragment and not any(_fits(value, alternative) for alternative in fragment["anyOf"]):
        return False
    if "not" in fragment and _fits(value, fragment["not"]):
        return False
    if "enum" in fragment and value not in fragment["enum"]:
        return False
    if not _within(value, fragment):
        return False
    kinds = fragment.get("type")
    if kinds is None:
        return True
    for kind in [kinds] if isinstance(kinds, str) else kinds:
        if kind == "null" and value is None:
            return True
        if kind == "string" and isinstance(value, str):
            return True
        if kind == "object" and isinstance(value, Mapping):
            return True
        if kind == "boolean" and isinstance(value, bool):
            return True
        if kind == "integer" and whole_number(value) is not None:
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
    if isinstance(value, list) and not fragment.get("minItems", 0) <= len(value) <= fragment.get("maxItems", len(value)):
        return False
    if isinstance(value, str):
        if not fragment.get("minLength", 0) <= len(value) <= fragment.get("maxLength", len(value)):
            return False
        if "pattern" in fragment and _pattern(fragment["pattern"]).search(value) is None:
            return False
    return True


def _pattern(pattern: str) -> re.Pattern[str]:
    """A JSON Schema pattern as ECMA-262 reads it: a trailing `$` ends the text (Python's `$` would
    also match before a final newline, which the document's readers refuse)."""
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\Z"
    return re.compile(pattern)


def check_fields(raw: Mapping[str, Any], fields: Mapping[str, dict[str, Any]], where: str = "") -> None:
    for name, fragment in fields.items():
        value = raw.get(name)
        if value is not None and fragment and not _fits(value, fragment):
            field_name = f"{where}.{name}" if where else f"`{name}`"
            raise InvalidRequest("invalid_field", f"{field_name} must be {_described(fragment)}")


def _described(fragment: Mapping[str, Any]) -> str:
    if "anyOf" in fragment:
        alternatives = [f for f in fragment["anyOf"] if f != _NULL]
        nullable = len(alternatives) < len(fragment["anyOf"])
        return " or ".join(map(_described, alternatives)) + (" (or null)" if nullable else "")
    if "enum" in fragment:
        return "one of " + ", ".join(map(str, fragment["enum"]))
    kinds = fragment["type"]
    names = {
        "object": "an object",
        "array": "a list",
        "integer": "a whole number",
        "string": "a text",
        "boolean": "true or false",
    }
    text = " or ".join(names.get(k, f"a {k}") for k in ([kinds] if isinstance(kinds, str) else kinds))
    bounds = [
        f"{word} {fragment[b]}"
        for b, word in (("minimum", "at least"), ("exclusiveMinimum", "above"), ("maximum", "at most"))
        if b in fragment
    ]
    if fragment.get("minLength") == 1:
        bounds.append("not empty")
    elif fragment.get("minLength"):
        bounds.append(f"at least {fragment['minLength']} characters")
    if "maxLength" in fragment:
        bounds.append(f"at most {fragment['maxLength']} characters")
    if "minItems" in fragment:
        bounds.append(f"at least {fragment['minItems']} item(s)")
    if "maxItems" in fragment:
        bounds.append(f"at most {fragment['maxItems']} items")
    if "pattern" in fragment:
        bounds.append(f"matching {fragment['pattern']}")
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


# ---- the verbs' and the executors' bodies: each a shape, its one validator `read_fields` ----
AWAIT_ERROR_MAX = 2000
EXECUTOR_TOOLS_MAX = 64
EXECUTOR_NAME_MAX = 100
SLUG_PATTERN = r"^[-a-zA-Z0-9_]+$"
DIGEST_PATTERN = r"^[0-9a-f]{64}$"


def is_digest(value: Any) -> bool:
    """A call's digest as a person hands it back: 64 lowercase hex characters."""
    return isinstance(value, str) and re.fullmatch(DIGEST_PATTERN, value) is not None


def _or_null(fragment: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [fragment, _NULL]}


@dataclass(frozen=True)
class BodyShape:
    """A verb's body: its fields, each with its JSON Schema (null only where the fragment allows
    it), the fields it must carry, whether the body may be left out (absent or null), and a rule
    across its fields. Fields it does not name are ignored (a verb reads only its own)."""

    title: str
    fields: Mapping[str, dict[str, Any]]
    required: tuple[str, ...] = ()
    optional: bool = False
    rule: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""


RETRY_BODY = BodyShape(
    "RetryTaskIn",
    # The keys of the non-replayable calls a harnessed round already made, which the person
    # confirms may be made again (409 `nonreplayable_calls_made` lists them).
    {"confirm_calls": _or_null({"type": "array", "items": {"type": "string"}})},
    optional=True,
)
# The digest the approver saw (the inbox item's): a call that changed since is `approval_stale`.
# With `args`, the person edited the call's arguments before approving it (`approve_edited`):
# then the digest, of the call as they saw it before editing, is required.
_EDIT_NEEDS_DIGEST = {
    "anyOf": [
        {"not": {"required": ["args"]}},
        {"properties": {"args": _NULL}},
        {"required": ["digest"], "properties": {"digest": {"type": "string"}}},
    ]
}
APPROVE_BODY = BodyShape(
    "ApproveIn",
    {
        "digest": _or_null({"type": "string", "pattern": DIGEST_PATTERN}),
        "args": _or_null({"type": "object"}),
    },
    optional=True,
    rule=_EDIT_NEEDS_DIGEST,
    description="`digest`: the call as the approver saw it (a call that changed since is 409 approval_stale). "
    "`args`: the arguments the approver edited it to (the edited call gets its own digest; the model is told who "
    "edited them); an edit needs the `digest` of the call it edits.",
)
REASON_BODY = BodyShape("ReasonIn", {"reason": {"type": "string", "default": ""}}, optional=True)
ANSWER_BODY = BodyShape("ValueIn", {"value": {}})
# An await's outcome: its `value`, or `error` (what it waited on failed: it fails with
# await_failed and these words), never both.
_AWAIT_OUTCOME: dict[str, dict[str, Any]] = {
    "value": {},
    "error": _or_null({"type": "string", "minLength": 1, "maxLength": AWAIT_ERROR_MAX, "pattern": r"\S"}),
}
_ONE_OUTCOME = {"not": {"required": ["value", "error"], "properties": {"value": {"not": _NULL}, "error": {"type": "string"}}}}
# The token rides in the body, where access logs do not keep it.
RESOLVE_BODY = BodyShape(
    "ResolveIn",
    {"token": {"type": "string"}, **_AWAIT_OUTCOME},
    required=("token",),
    rule=_ONE_OUTCOME,
    description="A client await's bearer proof in the body, where access logs do not keep it: its value, or that "
    "what it waited on failed (`error`: the await fails with await_failed and these words).",
)
AWAIT_OUTCOME_BODY = BodyShape(
    "AwaitOutcomeIn",
    _AWAIT_OUTCOME,
    rule=_ONE_OUTCOME,
    description="Its `value`, or `error` (what the await waited on failed: it fails with await_failed and these "
    "words), never both.",
)
REGISTER_BODY = BodyShape(
    "RegisterIn",
    {
        # Runner tools of the registry (which ones are installed is the catalog's to say).
        "tools": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": EXECUTOR_TOOLS_MAX},
        "name": {"type": "string", "maxLength": EXECUTOR_NAME_MAX, "default": ""},
        "workspace": _or_null({"type": "string", "minLength": 1, "maxLength": 64, "pattern": SLUG_PATTERN}),
    },
    required=("tools",),
)
RESULT_BODY = BodyShape(
    "ResultIn",
    {
        "ok": {"type": "boolean"},
        "value": {},
        "error": _or_null({"type": "string"}),
        "key": _or_null({"type": "string"}),
        # The executor stopped the call because its heartbeat answered `cancel`.
        "stopped": {"type": "boolean", "default": False},
    },
    required=("ok",),
)


def body_schema(shape: BodyShape) -> dict[str, Any]:
    """The shape as the OpenAPI document shows it."""
    schema: dict[str, Any] = {"title": shape.title, "type": "object", "properties": dict(shape.fields), **shape.rule}
    if shape.required:
        schema["required"] = list(shape.required)
    if shape.description:
        schema["description"] = shape.description
    return {"anyOf": [schema, _NULL]} if shape.optional else schema


def check_field(shape: BodyShape, name: str, value: Any) -> None:
    """One field of the shape, as a verb's caller hands it over (the kernel's own callers too)."""
    fragment = shape.fields[name]
    if not _fits(value, fragment):
        raise InvalidRequest("invalid_field", f"`{name}` must be {_described(fragment)}")


def read_fields(shape: BodyShape, body: Any) -> dict[str, Any]:
    """A verb's body checked against its shape, the one validator of its contract: the fields it
    names, each of its type (invalid_field), the required ones present, the rule across them."""
    if body is None and shape.optional:
        return {}
    if not isinstance(body, Mapping):
        raise InvalidRequest("invalid_request", "the body must be a JSON object")
    for name in shape.required:
        if name not in body:
            raise InvalidRequest("invalid_field", f"`{name}` is required")
    for name in shape.fields:
        if name in body:
            check_field(shape, name, body[name])
    if shape.rule and not _holds(body, shape.rule):
        raise InvalidRequest("invalid_request", f"the body breaks its rule: {_rule_words(shape)}")
    return dict(body)


def _holds(body: Mapping[str, Any], rule: Mapping[str, Any]) -> bool:
    """Whether an object body holds a rule across its fields (`not`, `anyOf`, `required`, `properties`)."""
    if "not" in rule and _holds(body, rule["not"]):
        return False
    if "anyOf" in rule and not any(_holds(body, alternative) for alternative in rule["anyOf"]):
        return False
    if not all(name in body for name in rule.get("required", ())):
        return False
    return all(_fits(body[name], fragment) for name, fragment in rule.get("properties", {}).items() if name in body)


def _rule_words(shape: BodyShape) -> str:
    if shape.rule is _ONE_OUTCOME:
        return "give a `value` or an `error`, not both"
    if shape.rule is _EDIT_NEEDS_DIGEST:
        return "edited `args` need the `digest` of the call you edited"
    return str(shape.rule)
