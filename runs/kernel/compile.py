"""Compile a request into what the kernel writes: a create into a `RunRequest`, an append's (or
a round's) tasks into `TaskSpec`s, validated whole before anything is written. Pure: no HTTP
(the API layer parses bodies, `runs.schemas.parse_body`), no database writes (a create reads
its agent's latest version).

Every refusal is a typed `InvalidRequest` (S30, S31): unknown `after` keys, cycles,
duplicate keys, the envelope caps, NUL bytes. A number's exponent form is judged on the text
the client sent (`parse_body`), never here on Python's `repr` of the float it became.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from oz0agents.assignment import Assigned, assign, pin
from oz0agents.models import Agent, AgentVersion
from runs.kernel.approvals import problem_field, rule_problems
from runs.kernel.errors import InvalidRequest
from runs.kernel.graph import find_cycle
from runs.kernel.guards import GuardError, parse_guard
from runs.kernel.output_schemas import schema_problem
from runs.kernel.priorities import DEFAULT as DEFAULT_PRIORITY
from runs.kernel.priorities import parse_priority
from runs.kernel.request_shapes import (
    APPROVAL_MODES,
    CREATE_FIELDS,
    KEY_PATTERN,
    KINDS,
    MAX_APPROVAL_RULES,
    MAX_DEPTH,
    MAX_ENTRIES,
    MAX_FAN,
    MAX_READS,
    MAX_STEPS_PER_REQUEST,
    MAX_TIMEOUT_SECONDS,
    POLICIES,
    TASK_FIELDS,
    check_fields,
    refuse_unknown_fields,
    whole_number,
)
from runs.kernel.templates import failures_read
from runs.tools import get_tool
from tenancy.models import Workspace


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
    flow: bool = False,
) -> Compiled:
    """Validate `raw_tasks` (and the deliverable) against each other and the run's existing keys.

    `existing_keys` maps the run's current keys to their kinds (appends). `flow`: the tasks a flow's
    manifest made (flow_tasks), whose end is a `settled` join no client request may ask for. Raises
    before anything is written; returns the task specs in request order.
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
        kind = raw.get("kind")
        _require(kind is not None, "missing_field", f"{where} needs `kind`")
        _require(isinstance(kind, str) and kind in KINDS, "invalid_kind", f"{where}: kind must be one of {', '.join(KINDS)}")
        assert isinstance(kind, str)
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
        if not flow:  # a flow's own tasks (a `settled` join, `step` delegates) are the manifest's, not a client's
            check_fields(raw, TASK_FIELDS, where)
        spec = _kind_spec(kind, raw, where, len(after), flow=flow)
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


def _kind_spec(kind: str, raw: Mapping[str, Any], where: str, sources: int, *, flow: bool = False) -> dict[str, Any]:
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
        if flow and mode == "settled":
            # A flow's end: settled once every step has, whatever each ended as; its output named.
            return {"mode": "settled", **({"output": raw["output"]} if raw.get("output") is not None else {})}
        _require(mode in ("all", "any", "quorum"), "invalid_field", f"{where}.mode must be all, any or quorum")
        _require(sources > 0, "invalid_field", f"{where}: a join needs at least one source in `after`")
        spec = {"mode": mode}
        if mode == "quorum":
            quorum = whole_number(raw.get("quorum"))
            _require(
                quorum is not None and 1 <= quorum <= sources,
                "invalid_field",
                f"{where}.quorum must be a whole number from 1 to its {sources} sources",
            )
            spec["quorum"] = quorum
        return spec
    if kind == "delegate":
        return delegate_spec(raw, where)
    raise InvalidRequest("invalid_kind", f"{where}: unknown kind {kind!r}")


# How a delegate task reads its child (F14-F16): its answer or labelled failure (delegate, ask),
# or only kinds, flags and schema-checked values (quarantine). Flows are not on this install yet.
# `step` is a flow's own step (compile_flow), never a client's.
DELEGATE_VIAS = ("delegate", "ask", "flow", "quarantine", "step")


def delegate_spec(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A delegate task's fields: the agent of its child run, the child's input, and `via`."""
    agent = _string(raw, "agent", where, required=True)
    _require(bool(agent), "invalid_field", f"{where}.agent must name an agent")
    via = raw.get("via", "delegate")
    _require(via in DELEGATE_VIAS, "invalid_field", f"{where}.via must be one of delegate, ask, flow, quarantine")
    spec: dict[str, Any] = {"agent": agent, "input": raw.get("input"), "via": via}
    schema = raw.get("output_schema")
    if via == "quarantine":
        _require(schema is not None, "missing_field", f"{where}: a quarantine needs `output_schema` (what its child may answer)")
    if schema is not None:
        _require(isinstance(schema, Mapping), "invalid_field", f"{where}.output_schema must be a JSON Schema object")
        problem = schema_problem(schema)
        _require(problem is None, "invalid_field", f"{where}.output_schema is not a JSON Schema: {problem}")
        spec["output_schema"] = dict(schema)
    if isinstance(raw.get("tool"), str):
        spec["tool"] = raw["tool"]
    if raw.get("when") is not None:
        try:
            parse_guard(raw["when"])
        except GuardError as bad:
            raise InvalidRequest("invalid_field", f"{where}.when is not a guard: {bad}") from None
        spec["when"] = raw["when"]
    return spec


# The round tools that delegate (F14, F15), and the `via` each gives its task. `oz.ask_agent` is
# the built-in Ask agent: a question to another agent, never to be confused with `oz.ask`, which
# asks a person.
DELEGATE_TOOLS = {"oz.delegate": "delegate", "oz.ask_agent": "ask", "oz.quarantine": "quarantine", "oz.flow": "flow"}


def delegate_call_spec(tool: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """The delegate task a model's call of a delegating tool authors; InvalidRequest when its
    arguments cannot make one."""
    via = DELEGATE_TOOLS[tool]
    raw: dict[str, Any] = {"agent": args.get("flow") if via == "flow" else args.get("agent"), "via": via, "tool": tool}
    if via == "ask":
        question = args.get("question")
        _require(isinstance(question, str) and bool(question), "invalid_field", f"{tool} needs a `question` (text)")
        raw["input"] = {"question": question}
    else:
        raw["input"] = args.get("input")
    if "output_schema" in args:
        raw["output_schema"] = args.get("output_schema")
    return delegate_spec(raw, tool)


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
    _require(
        len(rules) <= MAX_APPROVAL_RULES, "invalid_field", f"approval.rules has {len(rules)} rules; at most {MAX_APPROVAL_RULES}"
    )
    for index, rule in enumerate(rules):
        problems = rule_problems(rule)
        if problems:
            path, why = problems[0]
            field = problem_field(path)
            raise InvalidRequest("invalid_field", f"approval.rules[{index}]{field} {why}")
    return {"mode": mode, "rules": [dict(r) for r in rules]}


@dataclass
class RunRequest:
    """A create request compiled: everything `create_run` writes, validated whole."""

    agent_version: AgentVersion | None
    input: Any
    tasks: list[TaskSpec]
    deliverable: str | None
    approval: dict[str, Any]
    retry_budget: int
    private: bool
    # The run's id, chosen before it is written: a canary rollout assigns its arm by it.
    run_id: uuid.UUID = field(default_factory=uuid.uuid4)
    priority: int = DEFAULT_PRIORITY
    rollout: str = ""


def compile_create(
    body: Any, workspace: Workspace, *, inherited_priority: int | None = None, pinned: Pinned | None = None
) -> RunRequest:
    """A create request's body compiled into a RunRequest: the one validator of its contract
    (CREATE_FIELDS). The body arrives parsed and storable (`runs.schemas.parse_body`). `pinned`
    (never from a body: a caller of the kernel's) runs the agent's named version, not the one its
    rollout would assign, and records the arm it names (an eval's runs: `eval`)."""
    if not isinstance(body, Mapping):
        raise InvalidRequest("invalid_request", "the body must be a JSON object")
    refuse_unknown_fields(body, CREATE_FIELDS)
    check_fields(body, CREATE_FIELDS, "")
    run_id = uuid.uuid4()
    priority = parse_priority(body.get("priority"), inherited=inherited_priority)
    assigned = (
        _agent_version(body.get("agent"), workspace, run_id) if pinned is None else _pinned_version(body, workspace, pinned)
    )
    agent_version = assigned.version
    manifest = agent_version.manifest if agent_version else {}
    raw_tasks = body.get("tasks")
    if not raw_tasks and agent_version is not None:
        raw_tasks = (
            flow_tasks(manifest, body.get("input"))
            if manifest.get("kind") == "flow"
            else [_agent_round(manifest, body.get("input"))]
        )
    if not raw_tasks:
        raise InvalidRequest("missing_input", "a run needs `tasks`, or an `agent` whose manifest drives it")
    deliverable = body.get("deliverable")
    if deliverable is None and isinstance(raw_tasks, list) and raw_tasks and isinstance(raw_tasks[-1], Mapping):
        deliverable = raw_tasks[-1].get("key")
    compiled = compile_tasks(raw_tasks, deliverable=deliverable, flow=not body.get("tasks") and manifest.get("kind") == "flow")
    # A flow makes no calls of its own, so it adds no mode of its own: its steps run under their
    # agents' modes, made stricter by the `approval` its request names or its parent's.
    default_mode = "bypass" if manifest.get("kind") == "flow" else str(manifest.get("approval", {}).get("mode", "ask"))
    approval = compile_approval(body.get("approval"), default_mode=default_mode)
    if not body.get("approval") and manifest.get("approval", {}).get("rules"):
        approval["rules"] = list(manifest["approval"]["rules"])
    retry_budget = _retry_budget(body.get("retry"))
    private = body.get("private")
    if private is None:
        private = False
    if not isinstance(private, bool):
        raise InvalidRequest("invalid_field", "`private` must be true or false")
    return RunRequest(
        agent_version=agent_version,
        input=body.get("input"),
        tasks=compiled.tasks,
        deliverable=compiled.deliverable,
        approval=approval,
        retry_budget=retry_budget,
        private=private,
        run_id=run_id,
        priority=priority,
        rollout=assigned.arm,
    )


def compile_child(
    workspace: Workspace, agent: str, child_input: Any, *, private: bool, priority: int = DEFAULT_PRIORITY
) -> RunRequest:
    """A child run's request (F14): the named agent of the parent's workspace, driven by its
    manifest, with the delegate task's input and the parent's privacy and priority."""
    return compile_create({"agent": agent, "input": child_input, "private": private}, workspace, inherited_priority=priority)


FLOW_END = "flow"


def flow_tasks(manifest: Mapping[str, Any], run_input: Any) -> list[dict[str, Any]]:
    """A flow's steps as delegate tasks (F17), each a child run of its agent guarded by its `when:`.
    A step whose failure a later step reads (its guard or input template on the step's `failure` or
    `status`) absorbs it, so the error branch runs; any other step's failure propagates: what comes
    after it is skipped, and the flow fails with it. Every step meets in a `settled` join, `flow`,
    the run's deliverable: the flow ends when all its steps have settled (no step is a join loser),
    and its output is the steps the manifest names under `output:`, else its last step that
    completed (runs.kernel.scheduling.complete_join); a step's unread failure fails it instead
    (runs.kernel.settling)."""
    steps = list(manifest.get("steps") or [])
    read = failures_read(steps)
    tasks: list[dict[str, Any]] = []
    for step in steps:
        task: dict[str, Any] = {
            "key": step["id"],
            "kind": "delegate",
            "agent": step["agent"],
            "input": step.get("input", run_input),
            "via": "step",
            "after": list(step.get("after", [])),
            "on_failure": "absorb" if step["id"] in read else "propagate",
        }
        if step.get("when") is not None:
            task["when"] = step["when"]
        tasks.append(task)
    end: dict[str, Any] = {"key": FLOW_END, "kind": "join", "mode": "settled", "after": [step["id"] for step in steps]}
    if manifest.get("output") is not None:
        end["output"] = manifest["output"]
    tasks.append(end)
    return tasks


def _agent_version(name: Any, workspace: Workspace, run_id: uuid.UUID) -> Assigned:
    """The version of the run's workspace's agent of that name the run takes: its serving version
    (the newest, or the one a rollout pinned), or its canary on the canary's share of run ids
    (oz0agents.assignment). Agents belong to a workspace."""
    if name is None:
        return Assigned(None, "")
    if not isinstance(name, str):
        raise InvalidRequest("invalid_field", "`agent` must be an agent's name")
    agent = (
        Agent.objects.select_related("stable_version__agent", "canary_version__agent")
        .filter(workspace=workspace, name=name)
        .first()
    )
    assigned = assign(agent, run_id) if agent is not None else Assigned(None, "")
    if assigned.version is None:
        raise InvalidRequest("unknown_agent", f"no agent named {name!r} is registered in workspace {workspace.slug!r}")
    return assigned


@dataclass(frozen=True)
class Pinned:
    """A create for one version of its agent, whatever its rollout assigns, and the arm recorded
    on the run (`Run.rollout`, at most 8 characters) so that canary arms and scorecards can tell it apart."""

    version: int
    arm: str


def _pinned_version(body: Mapping[str, Any], workspace: Workspace, pinned: Pinned) -> Assigned:
    name = body.get("agent")
    assigned = pin(workspace, name, pinned.version, pinned.arm) if isinstance(name, str) else None
    if assigned is None:
        raise InvalidRequest("unknown_agent", f"no agent named {name!r} has version {pinned.version} in {workspace.slug!r}")
    return assigned


def _agent_round(manifest: Mapping[str, Any], run_input: Any) -> dict[str, Any]:
    """The first round of an agent's manifest loop."""
    tools = [t for t in manifest.get("tools", []) if isinstance(t, str)]
    return {
        "key": "r1",
        "kind": "round",
        "model": manifest.get("model", "script"),
        "fallback_models": list(manifest.get("fallback_models", [])),
        "prompt": manifest.get("instructions", ""),
        "tools": tools,
        **({"script": manifest["script"]} if "script" in manifest else {}),
    }


def _retry_budget(raw: Any) -> int:
    if raw is None:
        return 0
    budget = whole_number(raw.get("budget", 0)) if isinstance(raw, Mapping) else None
    if budget is None or not 0 <= budget <= 100:
        raise InvalidRequest("invalid_field", "`retry` must be {budget: a whole number from 0 to 100}")
    return budget
