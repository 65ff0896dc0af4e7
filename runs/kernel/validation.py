"""Compile a create or append request into task rows, validated whole before anything is written.

Every refusal is a typed `InvalidRequest` (S30, S31): unknown `after` keys, cycles,
duplicate keys, the envelope caps, NUL bytes and exponent-form numbers. A number's form is
judged on the text the client sent (`parse_body`), never on Python's `repr` of the float it
became: `0.00001` is a plain decimal even though `repr(1e-05)` is not.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from runs.kernel.errors import InvalidRequest, KernelError
from runs.kernel.graph import find_cycle
from runs.tools import get_tool

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


class PayloadTooLarge(KernelError):
    status = 413


@dataclass
class TaskSpec:
    key: str
    kind: str
    after: list[str]
    on_failure: str
    spec: dict[str, Any]
    composed: bool = False
    lineage: str = ""


@dataclass
class Compiled:
    tasks: list[TaskSpec] = field(default_factory=list)
    deliverable: str | None = None


def _reject_exponent(literal: str) -> float:
    # The literal is the client's own text: `0.00001` passes though its float's repr is 1e-05.
    if "e" in literal or "E" in literal:
        raise InvalidRequest("exponent_number", f"the number {literal} is in exponent form, which the row store cannot hold")
    number = float(literal)
    if not math.isfinite(number):
        raise InvalidRequest("invalid_number", f"the number {literal[:40]}... is too large to hold")
    return number


def _reject_constant(name: str) -> float:
    raise InvalidRequest("invalid_number", f"{name} is not a number the row store can hold")


def parse_body(raw: bytes) -> Any:
    """Parse a JSON request body, refusing what the row store cannot hold (S30, S31)."""
    if len(raw) > MAX_PAYLOAD_BYTES:
        raise PayloadTooLarge("payload_too_large", f"the body is {len(raw)} bytes; the cap is {MAX_PAYLOAD_BYTES}")
    if not raw.strip():
        return {}
    try:
        text = raw.decode("utf-8")
        body = json.loads(text, parse_float=_reject_exponent, parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise InvalidRequest("invalid_json", "the body is not UTF-8") from None
    except json.JSONDecodeError as error:
        raise InvalidRequest(
            "invalid_json", f"the body is not JSON: {error.msg} at line {error.lineno} column {error.colno}"
        ) from None
    except RecursionError:
        raise InvalidRequest("too_deep", f"the body nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as error:
        # An integer of more digits than Python converts (4,300).
        raise InvalidRequest("invalid_number", f"the body holds a number that cannot be read: {error}") from None
    check_storable(body)
    return body


def check_storable(value: Any, path: str = "$") -> None:
    """Refuse what the row store cannot hold: NUL bytes, unpaired surrogates, non-finite numbers,
    nesting deeper than MAX_DEPTH, and more than MAX_ENTRIES entries.

    Exponent-form numbers are judged where there is text to judge (`parse_body`); a float
    computed in Python has no form, and PostgreSQL stores it whatever its repr.
    """
    entries = 0
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InvalidRequest("too_deep", f"{_short(where)} nests deeper than {MAX_DEPTH} levels")
        if isinstance(item, str):
            _check_text(item, where)
        elif isinstance(item, bool) or item is None or isinstance(item, int):
            pass
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidRequest("invalid_number", f"{_short(where)} is not a finite number")
        elif isinstance(item, Mapping):
            entries += len(item)
            for k, v in item.items():
                _check_text(str(k), f"a key under {_short(where)}")
                stack.append((v, f"{where}.{k}", depth + 1))
        elif isinstance(item, list | tuple):
            entries += len(item)
            stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(item))
        else:
            raise InvalidRequest("invalid_value", f"{_short(where)} is not a JSON value")
        if entries > MAX_ENTRIES:
            raise InvalidRequest("content_items_too_many", f"the body holds more than {MAX_ENTRIES} entries")


def _short(where: str) -> str:
    return where if len(where) <= 200 else f"{where[:100]}...{where[-100:]}"


def _check_text(text: str, where: str) -> None:
    if "\x00" in text:
        raise InvalidRequest("nul_byte", f"{_short(where)} holds a NUL byte, which the row store cannot hold")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest("invalid_text", f"{_short(where)} holds an unpaired surrogate, which is not UTF-8") from None


def _require(condition: bool, key: str, detail: str) -> None:
    if not condition:
        raise InvalidRequest(key, detail)


def _string(task: Mapping[str, Any], name: str, where: str, *, required: bool = False) -> str | None:
    value = task.get(name)
    if value is None:
        _require(not required, "missing_field", f"{where} needs `{name}`")
        return None
    _require(isinstance(value, str), "invalid_field", f"{where}.{name} must be a string")
    return str(value)


def compile_tasks(
    raw_tasks: Any,
    *,
    existing_keys: Mapping[str, str] | None = None,
    deliverable: Any = None,
    composed: bool = False,
    lineage: str | None = None,
) -> Compiled:
    """Validate `raw_tasks` (and the deliverable) against each other and the run's existing keys.

    `existing_keys` maps the run's current keys to their kinds (appends). Raises before
    anything is written; returns the task specs in request order.
    """
    existing = dict(existing_keys or {})
    if raw_tasks is None:
        raw_tasks = []
    _require(isinstance(raw_tasks, list), "invalid_field", "`tasks` must be a list")
    if len(raw_tasks) > MAX_STEPS_PER_REQUEST:
        raise InvalidRequest(
            "too_many_steps", f"{len(raw_tasks)} steps in one request; the cap is {MAX_STEPS_PER_REQUEST} (append the rest)"
        )
    compiled = Compiled()
    seen: dict[str, str] = {}
    for index, raw in enumerate(raw_tasks):
        where = f"tasks[{index}]"
        _require(isinstance(raw, Mapping), "invalid_field", f"{where} must be an object")
        key = _string(raw, "key", where, required=True)
        assert key is not None
        _require(bool(KEY_PATTERN.match(key)), "invalid_key", f"{where}.key {key!r} must be 1-200 letters, digits, _ . : -")
        where = f"task {key!r}"
        if key in seen or key in existing:
            raise InvalidRequest("duplicate_key", f"the key {key!r} is used twice")
        kind = _string(raw, "kind", where, required=True)
        assert kind is not None
        _require(kind in KINDS, "invalid_kind", f"{where}: kind must be one of {', '.join(KINDS)}")
        if kind == "delegate":
            raise InvalidRequest("kind_unavailable", f"{where}: delegate tasks are not available on this install yet")
        after = raw.get("after", [])
        _require(
            isinstance(after, list) and all(isinstance(a, str) for a in after),
            "invalid_field",
            f"{where}.after must be a list of keys",
        )
        _require(len(set(after)) == len(after), "duplicate_after", f"{where}.after names a key twice")
        if kind == "round" and len(after) > MAX_READS:
            raise InvalidRequest("too_many_reads", f"{where} reads {len(after)} sources; a model step reads at most {MAX_READS}")
        if kind != "round" and len(after) > MAX_FAN:
            raise InvalidRequest("too_wide_a_fan", f"{where} waits on {len(after)} sources; the cap is {MAX_FAN}")
        on_failure = raw.get("on_failure", "propagate")
        _require(on_failure in POLICIES, "invalid_on_failure", f"{where}.on_failure must be one of {', '.join(POLICIES)}")
        spec = _kind_spec(kind, raw, where, len(after))
        seen[key] = kind
        compiled.tasks.append(
            TaskSpec(
                key=key, kind=kind, after=list(after), on_failure=on_failure, spec=spec, composed=composed, lineage=lineage or key
            )
        )

    known = set(seen) | set(existing)
    for task in compiled.tasks:
        for source in task.after:
            if source not in known:
                raise InvalidRequest("unknown_after", f"task {task.key!r} comes after {source!r}, which is not in the run")
            if source == task.key:
                raise InvalidRequest("cycle", f"task {task.key!r} comes after itself")
    cycle = find_cycle([{"key": t.key, "after": t.after} for t in compiled.tasks])
    if cycle:
        raise InvalidRequest("cycle", "the tasks form a cycle: " + " -> ".join(cycle))

    if deliverable is not None:
        _require(isinstance(deliverable, str), "invalid_field", "`deliverable` must be a task key")
        _require(deliverable in known, "unknown_deliverable", f"the deliverable {deliverable!r} is not a task of the run")
        compiled.deliverable = deliverable
    return compiled


def _kind_spec(kind: str, raw: Mapping[str, Any], where: str, sources: int) -> dict[str, Any]:
    if kind == "tool":
        name = _string(raw, "tool", where, required=True)
        assert name is not None
        tool = get_tool(name)
        if tool is None:
            raise InvalidRequest("unknown_tool", f"{where}: no tool named {name!r} is installed")
        args = raw.get("args", {})
        _require(isinstance(args, Mapping), "invalid_field", f"{where}.args must be an object")
        tool_spec: dict[str, Any] = {"tool": name, "args": dict(args)}
        if raw.get("timeout_s") is not None:
            tool_spec["timeout_s"] = _timeout(raw["timeout_s"], where)
        return tool_spec
    if kind == "round":
        model = _string(raw, "model", where, required=True)
        fallback = raw.get("fallback_models", [])
        _require(
            isinstance(fallback, list) and all(isinstance(f, str) for f in fallback),
            "invalid_field",
            f"{where}.fallback_models must be a list of routes",
        )
        tools = raw.get("tools", [])
        _require(
            isinstance(tools, list) and all(isinstance(t, str) for t in tools), "invalid_field", f"{where}.tools must be a list"
        )
        spec: dict[str, Any] = {
            "model": model,
            "fallback_models": list(fallback),
            "prompt": raw.get("prompt", ""),
            "tools": tools,
        }
        _require(isinstance(spec["prompt"], str), "invalid_field", f"{where}.prompt must be a string")
        if "script" in raw:
            script = raw["script"]
            _require(isinstance(script, list | Mapping), "invalid_field", f"{where}.script must be a list or an object of lists")
            spec["script"] = script
        return spec
    if kind == "await":
        question = raw.get("question", "")
        _require(isinstance(question, str), "invalid_field", f"{where}.question must be a string")
        spec = {"question": question}
        if raw.get("timeout_s") is not None:
            spec["timeout_s"] = _timeout(raw["timeout_s"], where)
        return spec
    if kind == "join":
        mode = raw.get("mode", "all")
        _require(mode in ("all", "any", "quorum"), "invalid_field", f"{where}.mode must be all, any or quorum")
        _require(sources > 0, "invalid_field", f"{where}: a join needs at least one source in `after`")
        spec = {"mode": mode}
        if mode == "quorum":
            quorum = raw.get("quorum")
            _require(
                isinstance(quorum, int) and not isinstance(quorum, bool) and 1 <= quorum <= sources,
                "invalid_field",
                f"{where}.quorum must be a whole number from 1 to its {sources} sources",
            )
            spec["quorum"] = quorum
        return spec
    raise InvalidRequest("invalid_kind", f"{where}: unknown kind {kind!r}")


def _timeout(timeout: Any, where: str) -> float | int:
    _require(
        isinstance(timeout, int | float) and not isinstance(timeout, bool) and 0 < timeout <= MAX_TIMEOUT_SECONDS,
        "invalid_field",
        f"{where}.timeout_s must be a positive number of seconds, at most {MAX_TIMEOUT_SECONDS:,} (366 days);"
        " leave it out for no clock of its own",
    )
    return timeout


def compile_approval(raw: Any, default_mode: str = "ask") -> dict[str, Any]:
    if raw is None:
        return {"mode": default_mode, "rules": []}
    _require(isinstance(raw, Mapping), "invalid_field", "`approval` must be an object")
    mode = raw.get("mode", default_mode)
    _require(mode in APPROVAL_MODES, "invalid_field", f"approval.mode must be one of {', '.join(APPROVAL_MODES)}")
    rules = raw.get("rules", [])
    _require(isinstance(rules, list), "invalid_field", "approval.rules must be a list")
    for index, rule in enumerate(rules):
        _require(
            isinstance(rule, Mapping) and isinstance(rule.get("tool"), str) and rule.get("decision") in ("allow", "deny"),
            "invalid_field",
            f"approval.rules[{index}] must be {{tool: glob, decision: allow|deny}}",
        )
    return {"mode": mode, "rules": [dict(r) for r in rules]}
