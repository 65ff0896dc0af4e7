"""The manifest's `harness:` field (F7): which loop drives the agent's job.

    harness: oz0                                   # the default: oz0's own round loop
    harness: {pydantic_ai: "pkg.module:agent"}     # a Pydantic AI Agent object
    harness: {openai_agents: "pkg.module:agent"}   # an OpenAI Agents SDK Agent object
    harness: {acp: {command: [...], env: {...}}}   # an ACP agent process, oz.fail on its oz0 MCP server
    harness: {jsonl: {command: [...], env: {...}}} # a process speaking oz0's JSON-lines protocol v1

Normalized to `{"kind": ..., "target": ...}` or `{"kind": ..., "command": [...], "env": {...}}`; the
default (`oz0`) is left out of the normalized manifest, so manifests without the field keep their digest.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from agents.parsing import Lines, Problem

HARNESS_KINDS = ("oz0", "pydantic_ai", "openai_agents", "acp", "jsonl")
TARGET_KINDS = ("pydantic_ai", "openai_agents")
PROCESS_KINDS = ("acp", "jsonl")
TARGET_PATTERN = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
COMMAND_ITEMS_MAX = 64
ARGUMENT_MAX = 4096
SHAPE = 'must be `oz0`, or one of {pydantic_ai: "pkg.module:agent"}, {openai_agents: "pkg.module:agent"}, ' + (
    "{acp: {command: [...], env: {...}}}, {jsonl: {command: [...], env: {...}}}"
)


def lint_harness(raw: Any, lines: Lines, errors: list[Problem]) -> dict[str, Any] | None:
    """The normalized harness, or None for oz0's own loop (also when the field is in error)."""

    def error(path: tuple[Any, ...], where: str, message: str) -> None:
        errors.append(Problem(lines.at("harness", *path), where, message))

    if raw is None or raw == "oz0":
        return None
    if isinstance(raw, str):
        error((), "harness", f"{raw!r} is not a harness; {SHAPE}")
        return None
    if not isinstance(raw, Mapping) or len(raw) != 1:
        error((), "harness", f"{SHAPE} (exactly one kind)")
        return None
    kind, value = next(iter(raw.items()))
    if kind not in HARNESS_KINDS or kind == "oz0":
        error((kind,), "harness", f"{kind!r} is not a harness kind (one of {', '.join(HARNESS_KINDS)})")
        return None
    where = f"harness.{kind}"
    if kind in TARGET_KINDS:
        if not isinstance(value, str) or not TARGET_PATTERN.match(value) or len(value) > 300:
            error((kind,), where, "must name the agent object as `package.module:attribute`")
            return None
        return {"kind": kind, "target": value}
    if not isinstance(value, Mapping):
        error((kind,), where, "must be {command: [program, arguments...], env: {NAME: value}}")
        return None
    ok = True
    unknown = set(value) - {"command", "env"}
    if unknown:
        error((kind,), where, f"has unknown field(s) {', '.join(sorted(map(str, unknown)))}; it holds `command` and `env`")
        ok = False
    command = value.get("command")
    if not isinstance(command, list) or not command or len(command) > COMMAND_ITEMS_MAX:
        error(
            (kind, "command"),
            f"{where}.command",
            f"must be a list of 1 to {COMMAND_ITEMS_MAX} strings: the program, then its arguments",
        )
        ok = False
    else:
        for index, part in enumerate(command):
            if not isinstance(part, str) or not part or len(part) > ARGUMENT_MAX or "\x00" in part:
                error(
                    (kind, "command", index),
                    f"{where}.command[{index}]",
                    f"must be a non-empty string of at most {ARGUMENT_MAX} characters",
                )
                ok = False
    env = value.get("env", {}) or {}
    if not isinstance(env, Mapping):
        error((kind, "env"), f"{where}.env", "must be a mapping of variable names to text")
        ok = False
    else:
        for name, text in env.items():
            if not isinstance(name, str) or not ENV_NAME_PATTERN.match(name):
                error((kind, "env", name), f"{where}.env", f"{name!r} is not an environment variable name")
                ok = False
            elif not isinstance(text, str):
                error((kind, "env", name), f"{where}.env.{name}", "must be text (quote numbers and booleans)")
                ok = False
    if not ok or not isinstance(command, list) or not isinstance(env, Mapping):
        return None
    return {"kind": kind, "command": [str(part) for part in command], "env": {str(k): str(v) for k, v in env.items()}}
