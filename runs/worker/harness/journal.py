"""A session's side of its round's journal (issue 29, runs/kernel/journal.py): which of the calls
it makes are answered from the tasks an earlier session of the round left, instead of running again.

The journal is a sequence. The session walks it: its call at position k answers from the journal's
k-th task when the tool and the digest of its args are the same and that task holds an answer to
give (it ran, or it is still running or waiting for a person: then the session waits for it as the
earlier one would have). The first call that differs is a divergence: from there on the journal's
tail is superseded, and each call is made for real as a new task — but for a non-replayable call
(a tool with an effect, a delegation, an approval of the framework's own tool, a person's answer)
identical to one of the superseded calls: that one's answer is given, so its effect never happens a
second time. Each recorded task answers at most one call of a session.

What counts as an answer to give: a task that never started (denied, expired, canceled or skipped
before a worker or child took it) answers nothing and its call is made again; a replayable call
that ran and failed is made again too (a retry is meant to mend failures, and making it again is
harmless by definition); everything else answers, completed or failed.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from runs import kernel
from runs.kernel import NOT_MADE, Claimed, call_replayable
from runs.models import Task, TaskStatus

JOURNAL_STATE_KEYS = ("journal", "journal_superseded", "journal_checkpoint")
RAN_AND_FAILED = (TaskStatus.FAILED, TaskStatus.TIMED_OUT, TaskStatus.CANCELED)


def gives_answer(task: Task) -> bool:
    """May this recorded task answer a session's call again (the module's rule)?"""
    if task.status in NOT_MADE and not task.attempt and task.child_id is None:
        return False
    return not (call_replayable(task.kind, task.spec) and task.status in RAN_AND_FAILED)


class ClaimGone(Exception):
    """The round's claim is gone (or its run stops) while a call was being replayed."""


@dataclass
class SessionJournal:
    """The journal as the session was handed it, and the session's walk along it."""

    run_id: Any
    entries: list[dict[str, Any]]
    superseded: list[dict[str, Any]]
    # The harness's own state as an earlier session left it (`journal_checkpoint`: `{at, state}`).
    checkpoint: dict[str, Any] | None = None
    at: int = 0
    # Resumed after a park: the journal's first calls, which the parked session had made, answer
    # as they did, whatever their outcome (a denial stays the answer; it is not asked again).
    answered_through: int = 0
    diverged: bool = False
    used: set[str] = field(default_factory=set)
    # A framework may run calls in parallel threads: each call takes its place in the sequence whole.
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def of(cls, run_id: Any, state: Mapping[str, Any]) -> SessionJournal:
        return cls(
            run_id=run_id,
            entries=[dict(e) for e in state.get("journal", []) if isinstance(e, Mapping)],
            superseded=[dict(e) for e in state.get("journal_superseded", []) if isinstance(e, Mapping)],
            checkpoint=dict(state["journal_checkpoint"]) if isinstance(state.get("journal_checkpoint"), Mapping) else None,
        )

    def resume(self, claimed: Claimed) -> None:
        """The harness resumed from the checkpoint: the journal's calls before it are in its own
        state, so the session's walk starts past them."""
        if self.checkpoint is None or self.at or self.used:
            return
        at = min(int(self.checkpoint.get("at", 0)), len(self.entries))
        if not kernel.round_resumed(claimed, at=at):
            raise ClaimGone()
        self.used.update(e["key"] for e in self.entries[:at])
        self.at = at

    def replay(self, claimed: Claimed, call: Mapping[str, Any]) -> str | None:
        """The key of the recorded task that answers `call` at the session's place, recorded as
        replayed, or None: the call is made for real at `self.at` (then `made`). Hold `lock`."""
        tool, digest = kernel.journal_call(call)
        if not self.diverged and self.at < len(self.entries):
            entry = self.entries[self.at]
            task = self._task(entry) if (entry["tool"], entry["digest"]) == (tool, digest) else None
            if task is not None and (self.at < self.answered_through or gives_answer(task)):
                return self._replayed(claimed, entry["key"])
            self.diverged = True
            self.superseded = [*self.superseded, *self.entries[self.at :]]
        for entry in self.superseded:
            if (entry["tool"], entry["digest"]) != (tool, digest) or entry["key"] in self.used:
                continue
            task = self._task(entry)
            if task is not None and not call_replayable(task.kind, task.spec) and gives_answer(task):
                return self._replayed(claimed, entry["key"])
        return None

    def made(self, key: str) -> None:
        self.used.add(key)
        self.at += 1
        if not self.diverged and self.at > len(self.entries):
            self.diverged = True  # past the journal's end: nothing is left to follow

    def _replayed(self, claimed: Claimed, key: str) -> str:
        if not kernel.round_replayed(claimed, key, at=self.at):
            raise ClaimGone()
        self.made(key)
        return key

    def _task(self, entry: Mapping[str, Any]) -> Task | None:
        if entry["key"] in self.used:
            return None
        return Task.objects.filter(run_id=self.run_id, key=entry["key"]).first()

    def replayable_prefix(self) -> list[dict[str, Any]]:
        """The journal's entries that answer again when called in order: the first that would not
        (and every one after it) is left out."""
        keys = [e["key"] for e in self.entries]
        rows = {t.key: t for t in Task.objects.filter(run_id=self.run_id, key__in=keys)}
        prefix = []
        for at, entry in enumerate(self.entries):
            task = rows.get(entry["key"])
            if task is None or not (at < self.answered_through or gives_answer(task)):
                break
            prefix.append({**entry, "task": task})
        return prefix
