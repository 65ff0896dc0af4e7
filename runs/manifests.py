"""Agent manifests (YAML): parse, validate as F2-F8 say, normalize, and register versions.

`lint(text)` reports every problem at once, each naming its field, the rule it breaks and the
line it sits on; `register(text, user, workspace=...)` stores a new `AgentVersion` of the workspace's
agent when the normalized manifest changed, and returns the latest version when it did not.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from django.db import IntegrityError, transaction

from runs.failures import PLATFORM_KINDS
from runs.models import Agent, AgentVersion, Workspace

KIND_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_.-]*$")
KIND_MAX = 40
DESCRIPTION_MAX = 200
KINDS_MAX = 32
NAME_MAX = 100
INSTRUCTIONS_MAX = 100_000
MANIFEST_MAX_BYTES = 256 * 1024
MAX_DEPTH = 32
NODES_MAX = 20_000
ON_FAILURE = ("propagate", "absorb", "halt")
APPROVAL_MODES = ("bypass", "ask", "rules")
DECISIONS = ("allow", "deny")
FAILURE_FLAGS = ("retryable", "partial", "person")
TOP_LEVEL = ("name", "description", "model", "fallback_models", "instructions", "tools", "failures", "approval", "script")
# Built-ins every agent may list without a registry entry.
BUILTIN_TOOLS = ("oz.fail", "oz.ask")


@dataclass(frozen=True)
class Problem:
    line: int
    field: str
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"line": self.line, "field": self.field, "message": self.message}

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


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


class _Problems(Exception):
    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("; ".join(map(str, problems)))
        self.problems = problems


def _load(text: str) -> tuple[Any, yaml.Node | None]:
    """The manifest's data and its node graph (for line numbers). Raises `_Refused`, `_Problems`
    or YAMLError."""
    _check_events(text)
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        problems = _json_problems(node)
        if problems:
            raise _Problems(problems)
        return loader.construct_document(node), node
    finally:
        loader.dispose()


class _Lines:
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


def _route_problem(value: Any) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return "must be a model route such as `openai:gpt-4o-mini` or `script`"
    if any(c.isspace() for c in value) or len(value) > 200:
        return "must be one route without spaces, at most 200 characters"
    return None


def lint(text: Any) -> Linted:
    """Validate a manifest's text; returns the normalized manifest (when valid), errors and warnings."""
    if not isinstance(text, str) or not text.strip():
        return Linted(None, [Problem(1, "manifest", "is empty: a manifest is a YAML mapping with at least `name` and `model`")])
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MANIFEST_MAX_BYTES:
        return Linted(None, [Problem(1, "manifest", f"is {size:,} bytes; a manifest is at most {MANIFEST_MAX_BYTES:,}")])
    try:
        data, node = _load(text)
    except _Refused as refused:
        return Linted(None, [refused.problem])
    except _Problems as found:
        return Linted(None, found.problems)
    except yaml.YAMLError as parse_error:
        mark = getattr(parse_error, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(parse_error, "problem", None) or str(parse_error)
        return Linted(None, [Problem(line, "manifest", f"is not valid YAML: {problem}")])
    lines = _Lines(node)
    errors: list[Problem] = []
    warnings: list[Problem] = []

    def error(path: tuple[Any, ...], where: str, message: str) -> None:
        errors.append(Problem(lines.at(*path), where, message))

    if not isinstance(data, Mapping):
        return Linted(None, [Problem(1, "manifest", "must be a YAML mapping of fields (name, model, tools, ...)")])

    for key in data:
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

    model = data.get("model")
    if model is None:
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
                "declares kinds but `oz.fail` is not in `tools:`, so the agent cannot end a run with them",
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
    if isinstance(data.get("description"), str):
        manifest["description"] = data["description"]
    if "script" in data:
        manifest["script"] = data["script"]
    return Linted(manifest, errors, warnings)


def _known_unserved(name: str) -> str | None:
    """Why no runner or later install can ever serve `name` on this server, or None when one may."""
    from runs.tools import is_registered

    if name.startswith("oz."):
        return f"is not one of the platform's built-ins ({', '.join(BUILTIN_TOOLS)}); nothing else serves `oz.` tools"
    if is_registered(name):  # registered yet not served here: only a test tool without OZ0_TEST_TOOLS
        return "is a test tool, served only where OZ0_TEST_TOOLS=1"
    return None


def _lint_tools(
    raw: Any, lines: _Lines, errors: list[Problem], warnings: list[Problem]
) -> tuple[list[str], dict[str, str], dict[str, float]]:
    from runs.kernel.validation import MAX_TIMEOUT_SECONDS
    from runs.tools import get_tool

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


def _lint_failures(raw: Any, lines: _Lines, errors: list[Problem]) -> list[dict[str, Any]]:
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


def _lint_approval(raw: Any, lines: _Lines, errors: list[Problem]) -> dict[str, Any]:
    if raw is None:
        return {"mode": "ask", "rules": []}
    if isinstance(raw, str):
        raw = {"mode": raw}
    if not isinstance(raw, Mapping):
        errors.append(Problem(lines.at("approval"), "approval", "must be {mode: bypass|ask|rules, rules: [{tool, decision}]}"))
        return {"mode": "ask", "rules": []}
    unknown = set(raw) - {"mode", "rules"}
    if unknown:
        errors.append(Problem(lines.at("approval"), "approval", f"has unknown field(s) {', '.join(sorted(map(str, unknown)))}"))
    mode = raw.get("mode", "ask")
    if mode not in APPROVAL_MODES:
        errors.append(Problem(lines.at("approval", "mode"), "approval.mode", f"must be one of {', '.join(APPROVAL_MODES)}"))
        mode = "ask"
    rules: list[dict[str, str]] = []
    raw_rules = raw.get("rules", []) or []
    if not isinstance(raw_rules, list):
        errors.append(Problem(lines.at("approval", "rules"), "approval.rules", "must be a list of {tool, decision}"))
        raw_rules = []
    for index, rule in enumerate(raw_rules):
        where = f"approval.rules[{index}]"
        if not isinstance(rule, Mapping) or set(rule) - {"tool", "decision"}:
            errors.append(
                Problem(lines.at("approval", "rules", index), where, "must be {tool: <name or glob>, decision: allow|deny}")
            )
            continue
        tool, decision = rule.get("tool"), rule.get("decision")
        if not isinstance(tool, str) or not tool:
            errors.append(
                Problem(
                    lines.at("approval", "rules", index, "tool"), f"{where}.tool", "must name a tool or a glob such as `test.*`"
                )
            )
            continue
        if decision not in DECISIONS:
            errors.append(
                Problem(
                    lines.at("approval", "rules", index, "decision"),
                    f"{where}.decision",
                    f"must be one of {', '.join(DECISIONS)}",
                )
            )
            continue
        rules.append({"tool": tool, "decision": decision})
    if rules and mode != "rules":
        errors.append(
            Problem(lines.at("approval", "rules"), "approval.rules", f"only apply under `mode: rules` (the mode is {mode!r})")
        )
    return {"mode": mode, "rules": rules}


def digest(manifest: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class Registered:
    version: AgentVersion
    created: bool
    warnings: list[Problem]


def register(text: Any, user: Any = None, *, workspace: Workspace) -> Registered:
    """Store the manifest as the workspace's agent's next version when it changed (runs record
    the version they ran).

    Raises `InvalidManifest` listing every error. `user` is whoever registers: the caller
    checks their standing in `workspace`, which the agent belongs to.
    """
    linted = lint(text)
    if not linted.ok:
        raise InvalidManifest(linted)
    manifest = linted.manifest
    assert manifest is not None
    manifest_digest = digest(manifest)
    for _ in range(3):
        try:
            with transaction.atomic():
                agent, _ = Agent.objects.get_or_create(workspace=workspace, name=manifest["name"])
                # Serialize registrations of one agent: the version number is a counter.
                Agent.objects.select_for_update().filter(pk=agent.pk).first()
                latest = AgentVersion.objects.filter(agent=agent).order_by("-version").first()
                if latest is not None and latest.digest == manifest_digest:
                    return Registered(latest, False, linted.warnings)
                version = AgentVersion.objects.create(
                    agent=agent,
                    version=(latest.version if latest else 0) + 1,
                    manifest_text=text,
                    manifest=manifest,
                    digest=manifest_digest,
                )
                return Registered(version, True, linted.warnings)
        except IntegrityError:  # a concurrent first registration of the same name: try again
            continue
    raise RuntimeError(f"could not register agent {manifest['name']!r}")
