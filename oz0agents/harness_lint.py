"""The manifest's `harness:` field (F7): which loop drives the agent's job.

    harness: oz0                                   # the default: oz0's own round loop
    harness: {pydantic_ai: "pkg.module:agent"}     # a Pydantic AI Agent object
    harness: {openai_agents: "pkg.module:agent"}   # an OpenAI Agents SDK Agent object
    harness: {acp: {program: NAME, env: {...}}}    # an ACP agent process, oz.fail on its oz0 MCP server
    harness: {jsonl: {program: NAME, env: {...}}}  # a process speaking oz0's JSON-lines protocol (v1; `protocol: 2` for v2)
    harness: {jsonl: {...}, timeout_s: 600}        # any kind: the round's deadline (OZ0_ROUND_TIMEOUT_SECONDS)

The installer, never a workspace, decides what code runs (`oz0agents.harness_programs`): a program is
one the installer lists in OZ0_HARNESS_PROGRAMS (a manifest's own `command:` is refused), and an
import target's module lies under OZ0_HARNESS_MODULES and imports, which a confined child process
checks (never this process: importing runs the module's code).

Normalized to `{"kind": ..., "target": ...}` or `{"kind": ..., "program": ..., "env": {...}}`; the
default (`oz0`) is left out of the normalized manifest, so manifests without the field keep their digest.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from oz0agents.harness_programs import ProgramsFileError, programs, reserved_env
from oz0agents.parsing import Lines, Problem
from runs.kernel import MAX_TIMEOUT_SECONDS
from runs.worker.harness.bridges import check_target, target_refusal

HARNESS_KINDS = ("oz0", "pydantic_ai", "openai_agents", "acp", "jsonl")
TARGET_KINDS = ("pydantic_ai", "openai_agents")
PROCESS_KINDS = ("acp", "jsonl")
TARGET_PATTERN = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SHAPE = 'must be `oz0`, or one of {pydantic_ai: "pkg.module:agent"}, {openai_agents: "pkg.module:agent"}, ' + (
    "{acp: {program: NAME, env: {...}}}, {jsonl: {program: NAME, env: {...}}}"
)
COMMAND_REFUSED = (
    "oz0 runs only programs the installer lists in OZ0_HARNESS_PROGRAMS: name one with `program: NAME` "
    "(a manifest's own `command:` is refused)"
)


def lint_harness(raw: Any, lines: Lines, errors: list[Problem], warnings: list[Problem]) -> dict[str, Any] | None:
    """The normalized harness, or None for oz0's own loop (also when the field is in error)."""

    def error(path: tuple[Any, ...], where: str, message: str) -> None:
        errors.append(Problem(lines.at("harness", *path), where, message))

    if raw is None or raw == "oz0":
        return None
    if isinstance(raw, str):
        error((), "harness", f"{raw!r} is not a harness; {SHAPE}")
        return None
    if not isinstance(raw, Mapping) or len([k for k in raw if k != "timeout_s"]) != 1:
        error((), "harness", f"{SHAPE} (exactly one kind, and optionally `timeout_s` beside it)")
        return None
    timeout: dict[str, Any] = {}
    if "timeout_s" in raw:
        seconds = raw["timeout_s"]
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds <= MAX_TIMEOUT_SECONDS:
            error(
                ("timeout_s",),
                "harness.timeout_s",
                f"must be a positive number of seconds, at most {MAX_TIMEOUT_SECONDS:,} (366 days); leave it out for "
                "OZ0_ROUND_TIMEOUT_SECONDS",
            )
            return None
        timeout = {"timeout_s": seconds}
    kind, value = next((k, v) for k, v in raw.items() if k != "timeout_s")
    if kind not in HARNESS_KINDS or kind == "oz0":
        error((kind,), "harness", f"{kind!r} is not a harness kind (one of {', '.join(HARNESS_KINDS)})")
        return None
    where = f"harness.{kind}"
    if kind in TARGET_KINDS:
        if not isinstance(value, str) or not TARGET_PATTERN.match(value) or len(value) > 300:
            error((kind,), where, "must name the agent object as `package.module:attribute`")
            return None
        refusal = target_refusal(value)
        if refusal is not None:
            error((kind,), where, refusal)
            return None
        checked = check_target(kind, value)
        if checked.ok is False:
            error((kind,), where, f"{value!r} cannot be loaded: {checked.detail}")
            return None
        if checked.ok is None:
            warnings.append(Problem(lines.at("harness", kind), where, f"{value!r} {checked.detail}"))
        return {"kind": kind, "target": value, **timeout}
    if not isinstance(value, Mapping):
        error((kind,), where, "must be {program: NAME, env: {NAME: value}}")
        return None
    if "command" in value:
        error((kind, "command"), f"{where}.command", COMMAND_REFUSED)
        return None
    ok = True
    fields = {"program", "env", "protocol"} if kind == "jsonl" else {"program", "env"}
    unknown = set(value) - fields
    if unknown:
        error(
            (kind,),
            where,
            f"has unknown field(s) {', '.join(sorted(map(str, unknown)))}; it holds "
            f"{', '.join(f'`{f}`' for f in sorted(fields))} (a round's `timeout_s` goes beside the kind, in `harness:`)",
        )
        ok = False
    protocol = value.get("protocol", 1)
    if protocol not in (1, 2) or isinstance(protocol, bool):
        error((kind, "protocol"), f"{where}.protocol", "must be 1 or 2, the JSON-lines protocol version the program speaks")
        ok = False
    name = value.get("program")
    if not isinstance(name, str) or not name:
        error((kind, "program"), f"{where}.program", "must name a program the installer lists in OZ0_HARNESS_PROGRAMS")
        ok = False
    else:
        try:
            allowed = programs()
        except ProgramsFileError as broken:
            error((kind, "program"), f"{where}.program", f"cannot be checked: {broken}")
            allowed = None
            ok = False
        if allowed is not None and name not in allowed:
            names = ", ".join(sorted(allowed)) or "none"
            error(
                (kind, "program"),
                f"{where}.program",
                f"{name!r} is no program the installer allows (OZ0_HARNESS_PROGRAMS; allowed here: {names})",
            )
            ok = False
    env = value.get("env", {}) or {}
    if not isinstance(env, Mapping):
        error((kind, "env"), f"{where}.env", "must be a mapping of variable names to text")
        ok = False
    else:
        for variable, text in env.items():
            if not isinstance(variable, str) or not ENV_NAME_PATTERN.match(variable):
                error((kind, "env", variable), f"{where}.env", f"{variable!r} is not an environment variable name")
                ok = False
            elif reserved_env(variable):
                error(
                    (kind, "env", variable),
                    f"{where}.env.{variable}",
                    "is set by oz0 or changes what code the program loads; only the installer's programs file may set it",
                )
                ok = False
            elif not isinstance(text, str):
                error((kind, "env", variable), f"{where}.env.{variable}", "must be text (quote numbers and booleans)")
                ok = False
    if not ok or not isinstance(env, Mapping):
        return None
    spoken = {"protocol": protocol} if protocol != 1 else {}
    return {"kind": kind, "program": name, "env": {str(k): str(v) for k, v in env.items()}, **spoken, **timeout}
