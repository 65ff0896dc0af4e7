"""A harnessed round's journal (issue 29): the calls its sessions made, in the order they made them.

Each entry is `{key, tool, digest}`: the `<round>.<n>` task that holds the call's answer, the
name the harness called (a registry tool, a delegating built-in, `oz.ask`, `oz.approval`) and the
digest of the call as the harness asked it (`call_digest(tool, args)`). The journal lives in the
round's state (`journal`), so whatever ends a session (a report, a crash, a lost worker) leaves it
for the next one; entries a session's diverging sequence left behind are kept apart
(`journal_superseded`), so a non-replayable call they hold is never made a second time.

A session started again is handed the journal (runs/worker/harness/journal.py): the same call at
the same place answers from the recorded task instead of running again.

A session waiting on a person may be **parked** (`round_park`): its round goes back to waiting,
holding no claim, with the harness's checkpoint and `parked: {on, at, since}` in its state; the
call `on` leaving the person's hands wakes it (runs.kernel.settling.wake_parked), and the session
started then resumes from the checkpoint, its first `at` calls answered as they were.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from runs.kernel.approvals import call_digest
from runs.kernel.commit import locked
from runs.kernel.graph import ASKING_STATUSES, OPEN_RUN_STATUSES
from runs.kernel.txn import Txn
from runs.kernel.worker import Claimed, held_task, merge_result
from runs.models import Task, TaskStatus


def journal_call(call: Mapping[str, Any]) -> tuple[str, str]:
    """The tool name and digest a call of `kernel.round_call`'s shape is journaled under: the call
    exactly as the harness asked it (a delegation's own args, not the child task they make)."""
    if "ask" in call:
        tool, args = "oz.ask", {"question": call.get("ask")}
    elif "native" in call:
        tool, args = "oz.approval", {"tool": call.get("native"), "args": call.get("args") or {}}
    else:
        tool, args = str(call.get("tool")), call.get("args") or {}
    return tool, call_digest(tool, args)


def journal_write(txn: Txn, task: Task, at: int, entry: Mapping[str, Any]) -> None:
    """The session's call at position `at` is `entry`. Where the journal already holds it there,
    nothing changes; else the journal's tail from `at` is superseded (kept apart, `journal_diverged`
    in the trace) and `entry` takes its place. The caller saves `task.state`."""
    journal = [dict(e) for e in task.state.get("journal", [])]
    at = max(0, min(int(at), len(journal)))
    if at < len(journal) and journal[at]["key"] == entry["key"]:
        return
    tail = [e for e in journal[at:] if e["key"] != entry["key"]]
    kept = [e for e in task.state.get("journal_superseded", []) if e["key"] != entry["key"]]
    task.state = {**task.state, "journal": [*journal[:at], dict(entry)], "journal_superseded": [*kept, *tail]}
    checkpoint = task.state.get("journal_checkpoint")
    if isinstance(checkpoint, Mapping) and int(checkpoint.get("at", 0)) > at:
        # The checkpoint stood on calls that are superseded now: a session cannot resume from it.
        task.state = {k: v for k, v in task.state.items() if k != "journal_checkpoint"}
    if tail:
        txn.event(task.key, "journal_diverged", data={"at": at, "superseded": [e["key"] for e in tail], "by": entry["key"]})


def round_replayed(claimed: Claimed, key: str, *, at: int) -> bool:
    """The session's call at position `at` is answered by the journal's task `key`, not made again:
    recorded in the trace (`journal_replayed`) and, when it comes from a superseded entry, moved back
    into the journal at `at`. False when the claim is gone."""
    with locked(claimed.run_id, "model") as txn:
        task = held_task(txn, claimed)
        if task is None:
            return False
        listed = [*task.state.get("journal", []), *task.state.get("journal_superseded", [])]
        entry = next((e for e in listed if e["key"] == key), None)
        if entry is None:
            return False
        journal_write(txn, task, at, entry)
        Task.objects.filter(pk=task.pk).update(state=task.state)
        txn.event(task.key, "journal_replayed", data={"key": key, "tool": entry["tool"], "at": at})
        return True


# A harness's own state is kept only while it is small: it rides in the round's state.
CHECKPOINT_MAX_BYTES = 256 * 1024


def round_checkpoint(claimed: Claimed, state: Any, *, at: int) -> bool:
    """The harness's own state (its framework's message history), taken when its session had made
    `at` calls: a session started again resumes from it (`resume` in the JSON-lines start) rather
    than from the beginning. False when the claim is gone or the state is not stored (too big)."""
    if len(json.dumps(state, separators=(",", ":")).encode()) > CHECKPOINT_MAX_BYTES:
        return False
    with locked(claimed.run_id, "model") as txn:
        task = held_task(txn, claimed)
        if task is None or at > len(task.state.get("journal", [])):
            return False
        task.state = {**task.state, "journal_checkpoint": {"at": at, "state": state}}
        Task.objects.filter(pk=task.pk).update(state=task.state)
        return True


def round_resumed(claimed: Claimed, *, at: int) -> bool:
    """The harness resumed from its checkpoint: the journal's first `at` calls are in its own state,
    answered without being made again (`journal_resumed` in the trace)."""
    with locked(claimed.run_id, "model") as txn:
        task = held_task(txn, claimed)
        if task is None:
            return False
        txn.event(task.key, "journal_resumed", data={"at": at, "keys": [e["key"] for e in task.state.get("journal", [])[:at]]})
        return True


# What the kernel itself notes on a round's state as its session calls: a park keeps its own copy.
NOTED_STATE_KEYS = ("journal", "journal_superseded", "journal_checkpoint", "nonreplayable_calls", "authored")


def round_park(claimed: Claimed, *, on: str, at: int, extra: Mapping[str, Any], state: Mapping[str, Any]) -> bool:
    """The session waits on `on`, a call in a person's hands, and ends its process (issue 29: waits
    hold nothing): the round goes back to waiting, unclaimed and not queued, with no deadline
    running, keeping what the session reports (`extra`: usage, stderr, model calls) and its state
    with `parked: {on, at, since}` (`at`: how many calls of the journal the session had walked).
    `on` leaving the person's hands wakes it (runs.kernel.settling.wake_parked).

    False, and nothing changes, when the claim is gone, the run is stopping, `on` is no longer a
    person's (decided meanwhile: the session reads the answer instead), or the round holds no
    checkpoint of its harness to resume from."""
    with locked(claimed.run_id, "worker") as txn:
        task = held_task(txn, claimed)
        if task is None or task.cancel_requested or txn.run.status not in OPEN_RUN_STATUSES:
            return False
        if not isinstance(task.state.get("journal_checkpoint"), Mapping):
            return False
        waited = Task.objects.filter(run=txn.run, key=on).values_list("status", flat=True).first()
        if waited not in ASKING_STATUSES:
            return False
        parked = {"on": on, "at": int(at), "since": txn.now.isoformat()}
        noted = {k: v for k, v in task.state.items() if k in NOTED_STATE_KEYS}
        txn.event(task.key, "session_parked", data={"on": on, "at": int(at)})
        txn.move(
            task,
            TaskStatus.WAITING,
            claim=None,
            ready=False,
            deadline_at=None,
            result=merge_result(txn, task, extra),
            state={**state, **noted, "parked": parked},
        )
        return True
