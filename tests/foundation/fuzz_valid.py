"""What the fuzz's positive cases become where the document cannot say every rule (issue 27.8): a
run's tasks are a program (the kernel's graph rules), a manifest is YAML the linter reads, an
executor's tools are the catalog's, `q` is a query language. Each mapper keeps what schemathesis
generated wherever it is valid as it stands (a task's kind, policy, texts, bounds; a body's other
fields) and replaces only what a rule the schema cannot state refuses, so the positive check
still runs on every operation and proves that valid input is accepted; negative cases are left
as generated, so the negative check runs on the raw schema.

Deterministic: whatever a mapper picks follows from the generated values and a counter, never
from a random source.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from datetime import date, timedelta
from typing import Any

# Keys a mapped append must never repeat (the staged runs' tasks), and a counter that keeps the
# keys of every append of one pass apart: the staged runs live as long as the pass.
_serial = itertools.count(1)
KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,199}$")
AGENT = "fuzzed"
RUNNER_TOOL = "test.remote"


def _text(value: Any, default: str) -> str:
    return value if isinstance(value, str) and value.strip() else default


def _task(raw: dict[str, Any], key: str, earlier: list[str]) -> dict[str, Any]:
    """One generated task made a valid one of the same kind: its key, policy and the fields valid
    as generated are kept; a tool is an installed one, a round is scripted, a join's sources and
    a delegate's agent exist."""
    kind = raw.get("kind", "tool")
    task: dict[str, Any] = {"key": key, "kind": kind}
    if raw.get("on_failure") is not None:
        task["on_failure"] = raw["on_failure"]
    # The generated `after` names keys of its own making; a task that had sources follows the last earlier one.
    if raw.get("after") and earlier:
        task["after"] = [earlier[-1]]
    if kind == "join" and not earlier:
        kind = task["kind"] = "await"
    if kind == "tool":
        task.update(tool="test.echo", args={"value": raw.get("args") if raw.get("args") is not None else 1})
    elif kind == "round":
        task.update(model="script", prompt=_text(raw.get("prompt"), "go"), script=[{"text": "done"}])
    elif kind == "await":
        task["question"] = _text(raw.get("question"), "?")
        if raw.get("timeout_s") is not None:
            task["timeout_s"] = raw["timeout_s"]
    elif kind == "join":
        task["after"] = task.get("after") or [earlier[-1]]
        mode = raw.get("mode") or "all"
        task["mode"] = mode
        if mode == "quorum":
            task["quorum"] = 1
    elif kind == "delegate":
        task.update(agent=AGENT, input=raw.get("input"), via="delegate")
    return task


def program(tasks: Any, *, taken: Iterable[str] = ()) -> list[dict[str, Any]]:
    """A generated task list as a valid program: keys unique (apart from `taken`), each task valid."""
    serial = next(_serial)
    keys = set(taken)
    made: list[dict[str, Any]] = []
    for index, raw in enumerate(tasks if isinstance(tasks, list) else []):
        raw = raw if isinstance(raw, dict) else {}
        generated = raw.get("key")
        key = generated if isinstance(generated, str) and KEY.match(generated) else f"t{index}"
        if key in keys:
            key = f"s{serial}-{index}"
        keys.add(key)
        made.append(_task(raw, key, [t["key"] for t in made]))
    return made or [_task({"kind": "tool"}, f"s{serial}-0", [])]


def _approval(raw: Any) -> Any:
    """The generated approval: its mode, and its rules' tools, decisions and names (a rule's `when`
    matchers are paths into a call's args, which the schema cannot say)."""
    if not isinstance(raw, dict):
        return raw
    approval = {"mode": raw["mode"]} if raw.get("mode") is not None else {}
    if isinstance(raw.get("rules"), list):
        approval["rules"] = [
            {name: rule[name] for name in ("tool", "decision", "name") if name in rule}
            for rule in raw["rules"]
            if isinstance(rule, dict)
        ]
    return approval


def create_body(body: dict[str, Any]) -> dict[str, Any]:
    made = dict(body)
    if made.get("agent") is not None:
        made["agent"] = AGENT
    if isinstance(made.get("tasks"), list):
        made["tasks"] = program(made["tasks"])
        made["deliverable"] = made["tasks"][-1]["key"]
    elif made.get("deliverable") is not None:
        made.pop("deliverable")  # an agent's run: its manifest names what it delivers
    made["approval"] = _approval(made.get("approval"))
    if made["approval"] is None:
        made.pop("approval")
    return made


def append_body(body: dict[str, Any], taken: Iterable[str]) -> dict[str, Any]:
    made = dict(body)
    made["tasks"] = program(made.get("tasks"), taken=taken)
    if made.get("deliverable") is not None:
        made["deliverable"] = made["tasks"][-1]["key"]
    return made


def manifest(body: dict[str, Any]) -> dict[str, Any]:
    """A manifest the linter passes, its failure kind's words seeded by the generated text."""
    words = re.sub(r"[^a-z ]", "", str(body.get("manifest", "")).lower()).strip() or "gone"
    text = f"name: {AGENT}\nmodel: script\ntools: [oz.fail]\nfailures:\n  - kind: not_found\n    description: {words[:80]}\n"
    return {**body, "manifest": text}


def executor(body: dict[str, Any]) -> dict[str, Any]:
    """Its tools, each an installed runner tool (as many as were generated)."""
    tools = body.get("tools")
    return {**body, "tools": [RUNNER_TOOL] * (len(tools) if isinstance(tools, list) and tools else 1)}


TERMS = (
    "finding:failure_not_found",
    f"agent:{AGENT}",
    "version:1",
    "since:2026-01-01",
    "until:2026-12-31T23:59:59Z",
    "step:f",
    "step_kind:tool",
    "workspace:any",
)


def schedule(body: dict[str, Any], serial: int, *, create: bool) -> dict[str, Any]:
    """A schedule's body (schedules/api.py): a run body the kernel compiles, a name of its own, a
    zone that exists, and one of cron and interval (what JSON Schema cannot say)."""
    made = dict(body)
    if create or "run" in made:
        made["run"] = {"agent": AGENT, "input": made.get("run", {}).get("input") if isinstance(made.get("run"), dict) else None}
    if create or "name" in made:
        made["name"] = f"{str(made.get('name', 's'))[:40]}-{serial}"
    timing = {k: made.pop(k) for k in ("cron", "interval_seconds", "timezone") if k in made}
    if create or timing:
        if "interval_seconds" in timing:
            made["interval_seconds"] = timing["interval_seconds"]
        else:
            made["cron"], made["timezone"] = "0 3 * * *", "UTC"
    return made


def trigger(body: dict[str, Any], serial: int) -> dict[str, Any]:
    """A trigger's body: a run body the kernel compiles and a name of its own."""
    return {**body, "run": {"agent": AGENT}, "name": f"{str(body.get('name', 't'))[:40]}-{serial}"}


def wall(body: dict[str, Any], serial: int, *, create: bool) -> dict[str, Any]:
    """A wall's body: an agent of its own (one wall per agent, 409 otherwise) and members who
    belong to the workspace (none: the fuzz's people are not named in the document)."""
    made = {**body, "members": []}
    if create:
        made["agent"] = f"fuzzed-wall-{serial}"
    return made


def approver_group(body: dict[str, Any], serial: int, *, create: bool) -> dict[str, Any]:
    """An approver group's body: a name of its own (409 otherwise), no members (the fuzz's people
    are not named in the document), no escalation group (none exists to name)."""
    made = {**body, "members": [], "escalate_to": None}
    made["name"] = f"{str(body.get('name') or 'g')[:40]}-{serial}"
    if made["name"] == "operators" or not made["name"][0].isalpha():
        made["name"] = f"g{made['name']}"[:64]
    return made


def wait_deadlines(body: dict[str, Any]) -> dict[str, Any]:
    """Deadlines whose escalation comes after the reminder (the install's defaults, 1 h and 4 h,
    standing in for null), or is off; no escalation group (none exists to name)."""
    made = {**body, "escalate_to": None}
    reminder = 3600 if made.get("reminder_seconds") is None else made["reminder_seconds"]
    escalation = 4 * 3600 if made.get("escalation_seconds") is None else made["escalation_seconds"]
    if reminder and escalation and escalation <= reminder:
        made["escalation_seconds"] = 0
    return made


def query(text: Any) -> str:
    """A findings query of valid terms, chosen by the generated text's characters."""
    seed = sum(map(ord, str(text)))
    return " ".join(term for bit, term in enumerate(TERMS) if seed >> bit & 1)


def numbers_range(query: dict[str, Any], today: date) -> dict[str, Any]:
    """A range the numbers accept: days or from/to (not both), from before to, to not after
    today, at most 366 days (insights.numbers.parse_range's rules beyond the schema)."""
    query = dict(query)
    if "from" not in query and "to" not in query:
        return query
    query.pop("days", None)
    until = min(_calendar_day(query.get("to"), today), today)
    since = _calendar_day(query.get("from"), until - timedelta(days=29))
    since = max(min(since, until), until - timedelta(days=365))
    query["from"], query["to"] = since.isoformat(), until.isoformat()
    return query


def _calendar_day(text: Any, default: date) -> date:
    """A day of the calendar: the pattern `YYYY-MM-DD` admits 2026-02-30 and 0000-00-00 too."""
    try:
        return date.fromisoformat(str(text)) if text is not None else default
    except ValueError:
        return default
