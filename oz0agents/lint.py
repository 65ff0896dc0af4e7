"""A manifest's rules (F2-F8): every problem of a manifest at once, each naming its field, the
rule it breaks and the line it sits on, plus the two F8 warnings; a valid manifest comes back
normalized (the document the registry stores and runs read).

Used by `POST /agents/lint`, `./oz0 plugin lint` and, before storing, `oz0agents.registry.register`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from oz0agents.flows import KnownAgents, lint_flow
from oz0agents.harness_lint import lint_harness
from oz0agents.parsing import Lines, Problem, Unparsable, parse
from runs.failures import PLATFORM_KINDS
from runs.kernel import MAX_TIMEOUT_SECONDS, approval_problem_field, rule_problems
from runs.tools import get_tool, is_registered

KIND_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_.-]*$")
KIND_MAX = 40
DESCRIPTION_MAX = 200
KINDS_MAX = 32
NAME_MAX = 100
INSTRUCTIONS_MAX = 100_000
ON_FAILURE = ("propagate", "absorb", "halt")
APPROVAL_MODES = ("bypass", "ask", "rules")
DECISIONS = ("allow", "deny")
FAILURE_FLAGS = ("retryable", "partial", "person")
TOP_LEVEL = (
    "name",
    "kind",
    "description",
    "model",
    "fallback_models",
    "instructions",
    "tools",
    "failures",
    "approval",
    "script",
    "harness",
)
# Built-ins every agent may list without a registry entry.
BUILTIN_TOOLS = ("oz.fail", "oz.ask", "oz.delegate", "oz.ask_agent", "oz.quarantine", "oz.flow")


@dataclass
class Linted:
    manifest: dict[str, Any] | None
    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors and self.manifest is not None


class InvalidManifest(Exception):
    def __init__(self, linted: Linted) -> None:
        super().__init__("; ".join(str(e) for e in linted.errors))
        self.linted = linted


def _route_problem(value: Any) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return "must be a model route such as `openai:gpt-4o-mini` or `script`"
    if any(c.isspace() for c in value) or len(value) > 200:
        return "must be one route without spaces, at most 200 characters"
    return None


def lint(text: Any, *, known_agents: KnownAgents | None = None) -> Linted:
    """Validate a manifest's text; returns the normalized manifest (when valid), errors and warnings.
    `known_agents` answers which names are agents of the workspace it is for (a flow's steps)."""
    try:
        document = parse(text)
    except Unparsable as unparsable:
        return Linted(None, unparsable.problems)
    data, lines = document.data, document.lines
    errors: list[Problem] = []
    warnings: list[Problem] = []

    def error(path: tuple[Any, ...], where: str, message: str) -> None:
        errors.append(Problem(lines.at(*path), where, message))

    if not isinstance(data, Mapping):
        return Linted(None, [Problem(1, "manifest", "must be a YAML mapping of fields (name, model, tools, ...)")])

    kind = data.get("kind", "agent")
    if kind not in ("agent", "flow"):
        error(("kind",), "kind", "must be `agent` (the default) or `flow`")
    is_flow = kind == "flow"
    for key in data if not is_flow else ():
        if key not in TOP_LEVEL:
            error((key,), str(key), f"is not a manifest field (known fields: {', '.join(TOP_LEVEL)})")

    name = data.get("name")
    if name is None:
        error(("name",), "name", "is required")
    elif not isinstance(name, str) or not NAME_PATTERN.match(name) or len(name) > NAME_MAX:
        error(
            ("name",),
            "name",
            f"must start with a lowercase letter and hold only lowercase letters, digits, `_`, `.` and `-`, at most {NAME_MAX} characters",
        )

    if is_flow:
        # A flow has steps, not a model loop (oz0agents/flows.py checks them, with their lines).
        flow, flow_errors = lint_flow(data, lines, known_agents)
        errors.extend(flow_errors)
        return Linted(flow if not errors else None, errors, warnings)

    harness = lint_harness(data.get("harness"), lines, errors, warnings)
    model = data.get("model")
    if model is None and harness is not None:
        # A harnessed agent's framework chooses its model; the round's route only names the harness.
        model = f"harness:{harness['kind']}"
    elif model is None and data.get("harness") not in (None, "oz0"):
        pass  # a harness in error: its own errors say what is wrong, not a model it never needed
    elif model is None:
        error(("model",), "model", "is required: the model route the agent's rounds call (e.g. `openai:gpt-4o-mini`)")
    elif (why := _route_problem(model)) is not None:
        error(("model",), "model", why)

    fallback_raw = data.get("fallback_models", [])
    fallback_models: list[str] = []
    if fallback_raw is None:
        fallback_raw = []
    if not isinstance(fallback_raw, list):
        error(("fallback_models",), "fallback_models", "must be a list of model routes")
    else:
        for index, route in enumerate(fallback_raw):
            if (why := _route_problem(route)) is not None:
                error(("fallback_models", index), f"fallback_models[{index}]", why)
            elif route == model or route in fallback_models:
                error(("fallback_models", index), f"fallback_models[{index}]", f"repeats the route {route!r}")
            else:
                fallback_models.append(route)

    instructions = data.get("instructions", "")
    if instructions is None:
        instructions = ""
    if not isinstance(instructions, str):
        error(("instructions",), "instructions", "must be text")
        instructions = ""
    elif len(instructions) > INSTRUCTIONS_MAX:
        error(("instructions",), "instructions", f"is {len(instructions)} characters; at most {INSTRUCTIONS_MAX}")

    tools, on_failure, timeouts = _lint_tools(data.get("tools", []), lines, errors, warnings)
    declared = _lint_failures(data.get("failures", []), lines, errors)
    approval = _lint_approval(data.get("approval"), lines, errors)

    if "script" in data and not isinstance(data["script"], list | Mapping):
        error(("script",), "script", "must be a list of script answers, or a mapping of route to answers (the script provider)")

    # F8: the two warnings of plugin lint.
    # Judged on what the text declares, so an invalid kind does not also draw the opposite warning.
    declares_kinds = bool(declared) or (isinstance(data.get("failures"), list) and bool(data["failures"]))
    if declares_kinds and "oz.fail" not in tools:
        warnings.append(
            Problem(
                lines.at("failures"),
                "failures",
                "declares kinds but `oz.fail` is not in `tools:`, so the agent cannot end a run with them: the model"
                " is not offered oz.fail, and a round that calls it anyway fails `round_expansion_refused`",
            )
        )
    if "oz.fail" in tools and not declares_kinds:
        warnings.append(
            Problem(
                lines.at("tools"),
                "tools",
                "lists `oz.fail` but `failures:` declares no kind, so every oz.fail ends the run as `undeclared`",
            )
        )

    if errors:
        return Linted(None, errors, warnings)
    manifest: dict[str, Any] = {
        "name": name,
        "model": model,
        "fallback_models": fallback_models,
        "instructions": instructions,
        "tools": tools,
        "tool_on_failure": on_failure,
        "failures": declared,
        "approval": approval,
    }
    if timeouts:
        manifest["tool_timeouts"] = timeouts
    if harness is not None:
        manifest["harness"] = harness
    if isinstance(data.get("description"), str):
        manifest["description"] = data["description"]
    if "script" in data:
        manifest["script"] = data["script"]
    return Linted(manifest, errors, warnings)


def _known_unserved(name: str) -> str | None:
    """Why no runner or later install can ever serve `name` on this server, or None when one may."""
    if name.startswith("oz."):
        return f"is not one of the platform's built-ins ({', '.join(BUILTIN_TOOLS)}); nothing else serves `oz.` tools"
    if is_registered(name):  # registered yet not served here: only a test tool without OZ0_TEST_TOOLS
        return "is a test tool, served only where OZ0_TEST_TOOLS=1"
    return None


def _lint_tools(
    raw: Any, lines: Lines, errors: list[Problem], warnings: list[Problem]
) -> tuple[list[str], dict[str, str], dict[str, float]]:
    tools: list[str] = []
    on_failure: dict[str, str] = {}
    timeouts: dict[str, float] = {}
    if raw is None:
        return tools, on_failure, timeouts
    if not isinstance(raw, list):
        errors.append(
            Problem(lines.at("tools"), "tools", "must be a list of tool names, or of {name, on_failure, timeout_s} items")
        )
        return tools, on_failure, timeouts
    for index, item in enumerate(raw):
        where = f"tools[{index}]"
        policy = None
        timeout = None
        if isinstance(item, Mapping):
            unknown = set(item) - {"name", "on_failure", "timeout_s"}
            if unknown:
                errors.append(
                    Problem(
                        lines.at("tools", index),
                        where,
                        f"has unknown field(s) {', '.join(sorted(map(str, unknown)))}; "
                        "a tool item holds `name`, `on_failure` and `timeout_s`",
                    )
                )
            timeout = item.get("timeout_s")
            if timeout is not None and (
                not isinstance(timeout, int | float) or isinstance(timeout, bool) or not 0 < timeout <= MAX_TIMEOUT_SECONDS
            ):
                errors.append(
                    Problem(
                        lines.at("tools", index, "timeout_s"),
                        f"{where}.timeout_s",
                        f"must be a positive number of seconds, at most {MAX_TIMEOUT_SECONDS:,} (366 days)",
                    )
                )
                timeout = None
            name = item.get("name")
            policy = item.get("on_failure")
            if policy is not None and policy not in ON_FAILURE:
                errors.append(
                    Problem(
                        lines.at("tools", index, "on_failure"), f"{where}.on_failure", f"must be one of {', '.join(ON_FAILURE)}"
                    )
                )
                policy = None
        else:
            name = item
        if not isinstance(name, str) or not name:
            errors.append(Problem(lines.at("tools", index), where, "must name a tool"))
            continue
        if name in tools:
            errors.append(Problem(lines.at("tools", index), where, f"lists {name!r} twice"))
            continue
        if name not in BUILTIN_TOOLS and get_tool(name) is None:
            unserved = _known_unserved(name)
            if unserved is not None:
                errors.append(Problem(lines.at("tools", index), where, f"names {name!r}, which {unserved}"))
                continue
            # Not an error: a later install or a runner may serve it (the seed's `github.get_issue`).
            warnings.append(
                Problem(
                    lines.at("tools", index),
                    where,
                    f"names {name!r}, which is not installed on this server yet; until a runner or an install"
                    " serves it, the agent's calls to it fail",
                )
            )
        tools.append(name)
        if policy is not None:
            on_failure[name] = policy
        if timeout is not None:
            timeouts[name] = float(timeout)
    return tools, on_failure, timeouts


def _lint_failures(raw: Any, lines: Lines, errors: list[Problem]) -> list[dict[str, Any]]:
    declared: list[dict[str, Any]] = []
    if raw is None:
        return declared
    if not isinstance(raw, list):
        errors.append(
            Problem(lines.at("failures"), "failures", "must be a list of {kind, description, retryable?, partial?, person?}")
        )
        return declared
    if len(raw) > KINDS_MAX:
        errors.append(
            Problem(
                lines.at("failures", KINDS_MAX),
                "failures",
                f"declares {len(raw)} kinds; an agent declares at most {KINDS_MAX} (F5)",
            )
        )
    seen: set[str] = set()
    for index, item in enumerate(raw):
        where = f"failures[{index}]"
        if not isinstance(item, Mapping):
            errors.append(Problem(lines.at("failures", index), where, "must be a mapping with `kind` and `description`"))
            continue
        ok = True
        unknown = set(item) - {"kind", "description", *FAILURE_FLAGS}
        if unknown:
            errors.append(
                Problem(lines.at("failures", index), where, f"has unknown field(s) {', '.join(sorted(map(str, unknown)))}")
            )
            ok = False
        kind = item.get("kind")
        kind_line = lines.at("failures", index, "kind")
        if kind is None:
            errors.append(Problem(kind_line, f"{where}.kind", "is required"))
            ok = False
        elif not isinstance(kind, str) or not KIND_PATTERN.match(kind):
            errors.append(
                Problem(
                    kind_line,
                    f"{where}.kind",
                    f"{kind!r} must hold lowercase letters, digits and `_`, starting with a letter (F3)",
                )
            )
            ok = False
        elif len(kind) > KIND_MAX:
            errors.append(
                Problem(kind_line, f"{where}.kind", f"{kind!r} is {len(kind)} characters; a kind is at most {KIND_MAX} (F3)")
            )
            ok = False
        elif kind in PLATFORM_KINDS:
            errors.append(Problem(kind_line, f"{where}.kind", f"{kind!r} is a platform kind; an agent never declares one (F3)"))
            ok = False
        elif kind in seen:
            errors.append(
                Problem(kind_line, f"{where}.kind", f"{kind!r} is declared twice; kinds are unique within an agent (F3)")
            )
            ok = False
        else:
            seen.add(kind)
        description = item.get("description")
        description_line = lines.at("failures", index, "description")
        if description is None or (isinstance(description, str) and not description.strip()):
            errors.append(Problem(description_line, f"{where}.description", "is required (F4)"))
            ok = False
        elif not isinstance(description, str):
            errors.append(Problem(description_line, f"{where}.description", "must be text (F4)"))
            ok = False
        elif len(description) > DESCRIPTION_MAX:
            errors.append(
                Problem(
                    description_line, f"{where}.description", f"is {len(description)} characters; at most {DESCRIPTION_MAX} (F4)"
                )
            )
            ok = False
        flags: dict[str, bool] = {}
        for flag in FAILURE_FLAGS:
            value = item.get(flag, False)
            if value is None:
                value = False
            if not isinstance(value, bool):
                errors.append(Problem(lines.at("failures", index, flag), f"{where}.{flag}", "must be true or false (F2)"))
                ok = False
            flags[flag] = bool(value)
        if ok:
            declared.append({"kind": kind, "description": description, **flags})
    return declared


def _lint_approval(raw: Any, lines: Lines, errors: list[Problem]) -> dict[str, Any]:
    if raw is None:
        return {"mode": "ask", "rules": []}
    if isinstance(raw, str):
        raw = {"mode": raw}
    if not isinstance(raw, Mapping):
        errors.append(
            Problem(lines.at("approval"), "approval", "must be {mode: bypass|ask|rules, rules: [{tool, decision, when, name}]}")
        )
        return {"mode": "ask", "rules": []}
    unknown = set(raw) - {"mode", "rules"}
    if unknown:
        errors.append(Problem(lines.at("approval"), "approval", f"has unknown field(s) {', '.join(sorted(map(str, unknown)))}"))
    mode = raw.get("mode", "ask")
    if mode not in APPROVAL_MODES:
        errors.append(Problem(lines.at("approval", "mode"), "approval.mode", f"must be one of {', '.join(APPROVAL_MODES)}"))
        mode = "ask"
    rules: list[dict[str, Any]] = []
    raw_rules = raw.get("rules", []) or []
    if not isinstance(raw_rules, list):
        errors.append(Problem(lines.at("approval", "rules"), "approval.rules", "must be a list of {tool, decision}"))
        raw_rules = []
    for index, rule in enumerate(raw_rules):
        where = f"approval.rules[{index}]"
        # The kernel's own check of a rule (runs.kernel.approvals): what lints here is what runs.
        problems = rule_problems(rule)
        for path, why in problems:
            field = approval_problem_field(path)
            errors.append(Problem(lines.at("approval", "rules", index, *path), f"{where}{field}", why))
        if not problems:
            rules.append(dict(rule))
    if rules and mode != "rules":
        errors.append(
            Problem(lines.at("approval", "rules"), "approval.rules", f"only apply under `mode: rules` (the mode is {mode!r})")
        )
    return {"mode": mode, "rules": rules}
