"""A flow's manifest (F5, F17): `kind: flow` with `steps:`, each run by an agent (or another flow)
as a child run, ordered by `after`, guarded by `when:`. Every problem is reported at once with
its line, as for an agent's manifest.

A flow declares no failure kinds: its steps fail with their agents' kinds (F5). `output:` names the
step (or the list of steps) whose output is the flow's. A later step reads
an earlier one's `output` and `failure` through its guard (error branches, F17) and its input's
templates (`{{ steps.<id>.output }}`, `{{ input.<name> }}`; runs.kernel.templates); both are
parsed by the kernel's whitelisted parser, never evaluated as code.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from oz0agents.parsing import Lines, Problem
from runs.kernel import GuardError, InvalidRequest, TemplateError, check_storable, guard_steps, parse_guard, template_steps

STEP_ID = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
STEP_FIELDS = ("id", "agent", "flow", "input", "after", "when")
FLOW_FIELDS = ("name", "kind", "description", "steps", "output")

# Which of the names given are agents (or flows) of the workspace a manifest registers in.
KnownAgents = Callable[[set[str]], set[str]]
# A flow's leaves meet in one `any` join, whose sources are capped at 32 (too_wide_a_fan).
STEPS_MAX = 32


def lint_flow(
    data: Mapping[str, Any], lines: Lines, known_agents: KnownAgents | None = None
) -> tuple[dict[str, Any] | None, list[Problem]]:
    """The normalized flow manifest (None when it has errors) and its problems. Given the workspace's
    agents (`known_agents`: registration, and lint naming a workspace), a step naming none of them is
    an error with its line; without them (`./oz0 plugin lint`) it is found when the step starts
    (`agent_unavailable`, kind unavailable)."""
    errors: list[Problem] = []

    def error(path: tuple[Any, ...], where: str, message: str) -> None:
        errors.append(Problem(lines.at(*path), where, message))

    for key in data:
        if key == "failures":
            error((key,), "failures", "a flow declares no failure kinds: its steps fail with their agents' kinds (F5)")
        elif key not in FLOW_FIELDS:
            error((key,), str(key), f"is not a flow's field (a flow holds {', '.join(FLOW_FIELDS)})")
    raw_steps = data.get("steps")
    if not isinstance(raw_steps, list) or not raw_steps:
        error(("steps",), "steps", "a flow needs `steps:`, a list of {id, agent, input, after, when}")
        return None, errors
    if len(raw_steps) > STEPS_MAX:
        error(("steps",), "steps", f"holds {len(raw_steps)} steps; at most {STEPS_MAX}")
    steps: list[dict[str, Any]] = []
    seen: set[str] = set()
    for index, raw in enumerate(raw_steps):
        where = f"steps[{index}]"
        if not isinstance(raw, Mapping):
            error(("steps", index), where, "must be a mapping with `id` and `agent`")
            continue
        for key in raw:
            if key not in STEP_FIELDS:
                error(("steps", index, key), f"{where}.{key}", f"is not a step's field ({', '.join(STEP_FIELDS)})")
        step_id = raw.get("id")
        if not isinstance(step_id, str) or not STEP_ID.match(step_id) or step_id == "flow":
            error(
                ("steps", index, "id"),
                f"{where}.id",
                "must start with a lowercase letter and hold only lowercase letters, digits and `_`, at most 40 (not `flow`)",
            )
            continue
        if step_id in seen:
            error(("steps", index, "id"), f"{where}.id", f"repeats the step id {step_id!r}")
            continue
        runner = raw.get("agent", raw.get("flow"))
        if ("agent" in raw) == ("flow" in raw) or not isinstance(runner, str) or not runner:
            error(("steps", index), where, "names exactly one `agent` (or `flow`) that runs the step")
        after = raw.get("after", [])
        if not isinstance(after, list) or not all(isinstance(a, str) for a in after):
            error(("steps", index, "after"), f"{where}.after", "must be a list of earlier step ids")
            after = []
        for source in after:
            if source not in seen:
                error(("steps", index, "after"), f"{where}.after", f"names {source!r}, which is not an earlier step")
        step: dict[str, Any] = {"id": step_id, "agent": runner, "after": list(after)}
        if "input" in raw:
            try:
                check_storable(raw["input"])
                step["input"] = raw["input"]
                unread = sorted(template_steps(raw["input"]) - set(after))
            except InvalidRequest as refused:
                error(("steps", index, "input"), f"{where}.input", refused.detail)
            except TemplateError as bad:
                error(("steps", index, "input"), f"{where}.input", str(bad))
            else:
                if unread:
                    error(
                        ("steps", index, "input"),
                        f"{where}.input",
                        f"reads {', '.join(unread)}, which the step does not come `after` (a template reads settled steps only)",
                    )
        if "when" in raw:
            try:
                read = guard_steps(parse_guard(raw["when"]))
            except GuardError as bad:
                error(("steps", index, "when"), f"{where}.when", f"is not a guard: {bad}")
            else:
                unread = sorted(read - set(after))
                if unread:
                    error(
                        ("steps", index, "when"),
                        f"{where}.when",
                        f"reads {', '.join(unread)}, which the step does not come `after` (a guard reads settled steps only)",
                    )
                step["when"] = raw["when"]
        seen.add(step_id)
        steps.append(step)
    if known_agents is not None and steps:
        named = {step["agent"] for step in steps if isinstance(step["agent"], str)}
        missing = named - known_agents(named)
        for index, step in enumerate(steps):
            if step["agent"] in missing:
                field = "agent" if "agent" in raw_steps[index] else "flow"
                error(
                    ("steps", index, field),
                    f"steps[{index}].{field}",
                    f"names {step['agent']!r}, which is not an agent of this workspace (register it first)",
                )
    output = _lint_output(data.get("output"), [step["id"] for step in steps], lines, errors)
    if errors:
        return None, errors
    manifest: dict[str, Any] = {"name": data.get("name"), "kind": "flow", "steps": steps, "failures": [], "tools": []}
    if output is not None:
        manifest["output"] = output
    if isinstance(data.get("description"), str):
        manifest["description"] = data["description"]
    return manifest, errors


def _lint_output(raw: Any, step_ids: list[str], lines: Lines, errors: list[Problem]) -> str | list[str] | None:
    """`output:` names the step whose output is the flow's, or a list of steps (the flow's output is
    then `{id: output}`); left out, the flow's output is its last step's that completed."""
    if raw is None:
        return None
    names = [raw] if isinstance(raw, str) else raw
    if not isinstance(names, list) or not names or not all(isinstance(name, str) for name in names):
        errors.append(Problem(lines.at("output"), "output", "must name a step, or be a list of step ids"))
        return None
    unknown = [name for name in names if name not in step_ids]
    if unknown:
        errors.append(Problem(lines.at("output"), "output", f"names {', '.join(map(repr, unknown))}, which is not a step"))
        return None
    if len(set(names)) != len(names):
        errors.append(Problem(lines.at("output"), "output", "names a step twice"))
        return None
    return raw if isinstance(raw, str) else list(names)
