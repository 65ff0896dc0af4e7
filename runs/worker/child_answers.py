"""What a round's model reads of a delegate task (F14, F15), and the delegating tools it is offered.

A child's answer is the tool's answer; a failed child is the tool's answer too, labelled as
failed with whose words its message is; a quarantine's failure carries no words at all.
"""

from __future__ import annotations

import json
from typing import Any

from runs import failures, kernel
from runs.models import Task


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def child_message(source: Task) -> dict[str, Any]:
    """A delegate task's answer for the model (F14, F15): the child's value, or its failure read
    as the tool's answer, labelled with whose words the message is. A quarantine's failure gives
    kind, flags, declared and the error's type, never words."""
    result = source.result or {}
    tool = source.spec.get("tool") or "oz.delegate"
    if source.status == "completed":
        return {"role": "tool", "id": source.key, "tool": tool, "ok": True, "content": _as_text(result.get("value"))}
    agent, job = source.spec.get("agent"), result.get("child")
    carried = failures.child_failure_of(result, content=True)
    if carried is None:
        # No child failure to carry (the child could not start, or its answer failed the schema): the task's own.
        carried = failures.task_failure(source.status, source.error_key, source.error_detail, content=True) or (
            failures.platform_failure("error", None)
        )
        if source.spec.get("via") == "quarantine":
            carried = {**carried, "message": None}
    label: dict[str, Any] = {"failed": True, "job": job, "agent": agent, **carried}
    if source.spec.get("via") == "quarantine":
        label.pop("message", None)
        label["error_type"] = result.get("failure", {}).get("error_type") or source.error_key
    else:
        label["words_of"] = kernel.words_of(agent, job) if job else "oz0"
    return {"role": "tool", "id": source.key, "tool": tool, "ok": False, "content": json.dumps(label, sort_keys=True)}


def delegate_schema(name: str) -> dict[str, Any]:
    agent = {"type": "string", "description": "The agent of this workspace to hand the work to"}
    if name == "oz.ask_agent":
        return {
            "name": name,
            "description": "Ask another agent a question; its answer, or its failure labelled as failed, is this tool's answer",
            "parameters": {
                "type": "object",
                "properties": {"agent": agent, "question": {"type": "string"}},
                "required": ["agent", "question"],
            },
        }
    if name == "oz.quarantine":
        return {
            "name": name,
            "description": "Run another agent in quarantine: you get only values matching output_schema, or its failure's kind",
            "parameters": {
                "type": "object",
                "properties": {"agent": agent, "input": {}, "output_schema": {"type": "object"}},
                "required": ["agent", "output_schema"],
            },
        }
    if name == "oz.flow":
        return {
            "name": name,
            "description": "Run a flow of this workspace as a child job; its answer, or its failure labelled as failed, is this tool's answer",
            "parameters": {
                "type": "object",
                "properties": {"flow": {"type": "string"}, "input": {}},
                "required": ["flow"],
            },
        }
    return {
        "name": name,
        "description": "Hand work to another agent as a child job; its answer, or its failure labelled as failed, is this tool's answer",
        "parameters": {"type": "object", "properties": {"agent": agent, "input": {}}, "required": ["agent"]},
    }
