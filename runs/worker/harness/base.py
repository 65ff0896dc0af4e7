"""What every harness adapter shares (F7): the job it is handed, the calls it makes back into oz0,
and how it ends.

An adapter (`runs/worker/harness/<kind>.py`) drives an agent written in a framework for one round
task. It speaks to oz0 only through `HarnessSession`:
- `call_tool(name, args)`: a registry tool, authored as the round's next `<round>.<n>` task by
  `kernel.round_call`, so it crosses the same approval stage (bypass / ask / rules, the inbox, the
  park clock) and leaves the same trace as a composed call of oz0's own loop; the session waits for
  it to settle and answers with its value, or its failure labelled with whose words it is.
- `call_tool("oz.delegate" | "oz.ask_agent" | "oz.quarantine" | "oz.flow", args)`: a delegating
  built-in the agent lists, authored as a delegate task (a child run, F14-F17); the child's answer,
  or its failure labelled as failed (a quarantine's with no words), is the call's answer.
- `ask(question)`: oz.ask, a person's answer (awaiting_input, announced as awaiting_human).
- `approval(tool, args)`: a framework asks before running one of its own tools (the Agents SDK's
  `needs_approval`, Pydantic AI's deferred approvals, ACP's `session/request_permission`): the
  call's digest crosses the run's approval stage as a call of oz0's would, and the answer is the
  grant or the denial, labelled with whose words it is; the framework runs the tool itself.
- `fail(kind, message)`: oz.fail, handed to `kernel.round_oz_fail`, the one entry that decides
  declared / undeclared and the 2,000-character cap (F6); the job ends there.
- `bill(usage)`: the tokens the framework reports, billed on the round task (each model request a
  framework reports is also a `provider_call` event of the round: runs/worker/harness/model_calls.py).
A session started again (a person's retry, a crash, a lost worker) walks its round's journal
(`runs/worker/harness/journal.py`): a call made again where an earlier session made it answers
from that call's task instead of running again.
A session waiting on a person (an approval, oz.ask) longer than OZ0_SESSION_PARK_SECONDS is parked
when its harness can resume from its own state (`parks`, the framework bridges, with a checkpoint
taken since its last model request): `kernel.round_park` stores it and the session ends
(`HarnessParked`, its process killed); the decision wakes the round, and the session started then
resumes from the checkpoint, the calls it had made answered as they were.
One that cannot be parked (JSON-lines, a bridge with no checkpoint) is released instead: its
process is kept but its thread given back (`HarnessReleased`, runs/worker/harness/keeper.py).
A run cancel reaches the session as `HarnessCanceled` (raised from any of these, or seen with
`canceled()`); the adapter passes it on to its framework or process and lets it propagate.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from oz0site import tracing
from runs import kernel
from runs.kernel import Claimed
from runs.models import TASK_ASKING, Run, RunStatus, Task, TaskStatus
from runs.tools import get_tool
from runs.worker.child_answers import child_message, delegate_schema
from runs.worker.harness.journal import JOURNAL_STATE_KEYS, ClaimGone, SessionJournal
from runs.worker.round_driver import tool_message

POLL_SECONDS = 0.2
STDERR_KEPT = 8000

# Set when the session worker is told to stop (Celery's worker_shutting_down, oz0site/celery.py):
# a session that can be parked and waits on a person parks at once, not when its park clock runs
# out. A person may take hours, and a warm shutdown waits for the session's thread; killed
# instead, the session would be replayed from its journal only once its lease ran out.
worker_stopping = threading.Event()


class HarnessCanceled(Exception):
    """The run is being canceled: the adapter stops its framework and lets this propagate."""


class JobEnded(Exception):
    """oz.fail was reported to the kernel: the job is over, nothing more to report."""


class HarnessParked(Exception):
    """The session was parked (`kernel.round_park`) while it waited on a person: its process ends,
    nothing more to report; the decision resumes it in a new session."""


class HarnessReleased(Exception):
    """The session waits on a person past the park clock and its process cannot be parked
    (JSON-lines): `kernel.round_release` marked it released, and its process goes to the keeper
    (runs/worker/harness/keeper.py), which gives it a thread again once `key` (task `waited`) is
    decided. Nothing more to report from this thread."""

    def __init__(self, key: str, waited: int) -> None:
        super().__init__(key)
        self.key = key
        self.waited = waited


class HarnessError(Exception):
    """The harness could not finish the job; `key` is the task's error key."""

    key = "harness_crashed"

    def __init__(self, detail: str, *, stderr: str = "") -> None:
        super().__init__(detail)
        self.detail = detail
        self.stderr = stderr


class HarnessUnavailable(HarnessError):
    key = "harness_unavailable"


class HarnessCrashed(HarnessError):
    key = "harness_crashed"


class HarnessProtocolError(HarnessError):
    key = "harness_protocol_error"


@dataclass
class CallResult:
    """A call's answer for the agent: its value, or a labelled failure (F14's shape)."""

    ok: bool
    value: Any = None
    failure: dict[str, Any] | None = None

    def as_message(self, call_id: str | int) -> dict[str, Any]:
        if self.ok:
            return {"type": "result", "id": call_id, "ok": True, "value": self.value}
        return {"type": "result", "id": call_id, "ok": False, "failure": self.failure}


def refused(detail: str) -> CallResult:
    """A call oz0 would not author (a tool the agent does not list, args that cannot be stored)."""
    return CallResult(
        ok=False,
        failure={
            "failed": True,
            "kind": "invalid_input",
            "error": "round_expansion_refused",
            "message": detail,
            "words_of": "oz0",
        },
    )


def _settled(task: Task) -> bool:
    return settled_status(task.status, task.failure_resolution)


def settled_status(status: str, resolution: Any) -> bool:
    """Whether a call with this status (and failure resolution) has an answer for the agent."""
    if status == TaskStatus.UNCERTAIN:
        # Its effect may have happened: a person's retry or abandon decides before the agent reads it (S10).
        return resolution is not None
    return status in (
        TaskStatus.COMPLETED,
        TaskStatus.FAILED,
        TaskStatus.TIMED_OUT,
        TaskStatus.CANCELED,
        TaskStatus.SKIPPED,
    )


@dataclass
class HarnessSession:
    claimed: Claimed
    task: Task
    run: Run
    manifest: Mapping[str, Any]
    cancel: threading.Event
    state: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=lambda: {"input_tokens": 0, "output_tokens": 0, "calls": 0})
    stderr: str = ""
    # The live stderr of the harness process while it runs (its channel's), read when a report is made.
    stderr_source: Callable[[], str] | None = None
    # Set when the round's deadline passed (`expire`): the adapter kills its process, no grace.
    timed_out: threading.Event = field(default_factory=threading.Event)
    # The digest of the code the round loaded (oz0agents.code_version), kept on the round's result.
    code_digest: str = ""
    # The model calls the framework reported (runs.worker.harness.model_calls): the report's
    # `provider_calls`, each a `provider_call` event of the round.
    provider_calls: list[dict[str, Any]] = field(default_factory=list)
    # The calls earlier sessions of this round made (runs/worker/harness/journal.py): a call made
    # again in the same place answers from its record instead of running again.
    journal: SessionJournal = field(init=False)
    # Whether the harness can be parked while it waits on a person (its process ended, resumed from
    # its checkpoint later): the framework bridges. `resumable`: its last checkpoint was stored and
    # no model request came after it, so resuming from it loses nothing.
    parks: bool = False
    resumable: bool = False
    # Whether the session can be released while it waits on a person (its thread given back, its
    # process kept by the keeper): JSON-lines processes, when they cannot be parked.
    releases: bool = False
    # The name of the round's kept job folder (runs/worker/harness/folders.py), once confined.
    job_folder: str = ""
    # When the round's deadline passes (time.monotonic()), kept across a release.
    deadline: float = float("inf")
    timeout_seconds: float = 0.0
    # The session's span where the session starts (oz0site.tracing; None when not traced): `start`
    # carries it to the harness, and the model requests the harness reports hang under it.
    trace_context: Any = field(default_factory=tracing.current_context)

    def __post_init__(self) -> None:
        parked = self.state.pop("parked", None)
        self.journal = SessionJournal.of(self.run.pk, self.state)
        if isinstance(parked, Mapping):
            # Resumed after a park: the calls it had made answer as they did, and its tokens so far stay billed.
            self.journal.answered_through = int(parked.get("at", 0))
            billed = (self.task.result or {}).get("usage") or {}
            for name in self.usage:
                value = billed.get(name, 0)
                self.usage[name] = value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

    def expire(self) -> None:
        """The round's deadline passed: stop the harness as a cancel would, but as a timeout."""
        self.timed_out.set()
        self.cancel.set()

    @property
    def harness(self) -> dict[str, Any]:
        return dict(self.manifest.get("harness") or {})

    @property
    def tools(self) -> list[str]:
        """The tools the agent lists that are called through oz0: registry tools and the delegating
        built-ins (oz.fail and oz.ask each harness offers in its own way)."""
        listed = self.task.spec.get("tools") or self.manifest.get("tools") or []
        return [str(name) for name in listed if not str(name).startswith("oz.") or str(name) in kernel.DELEGATE_TOOLS]

    @property
    def offers_fail(self) -> bool:
        """Whether the agent lists oz.fail (F6): only then is it offered to the framework or
        protocol, and only then does a call of it end the job."""
        listed = self.task.spec.get("tools") or self.manifest.get("tools") or []
        return "oz.fail" in listed

    def tool_schemas(self) -> list[dict[str, Any]]:
        schemas = []
        for name in self.tools:
            if name in kernel.DELEGATE_TOOLS:
                schemas.append(delegate_schema(name))
                continue
            tool = get_tool(name)
            schemas.append(
                {
                    "name": name,
                    "description": tool.description if tool else "",
                    "parameters": {"type": "object", "additionalProperties": True},
                }
            )
        return schemas

    def start_message(self, protocol: int = 1) -> dict[str, Any]:
        """What a harness is told of its job (the JSON-lines `start`; other adapters take the same
        facts). Protocol 2 adds the round's `journal` (`journal_start`)."""
        journal: dict[str, Any] = {}
        if protocol >= 2:
            journal["journal"] = self.journal_start()
            if self.journal.checkpoint is not None:
                journal["resume"] = self.journal.checkpoint
        return {
            "type": "start",
            "protocol": protocol,
            "run": str(self.run.pk),
            "task": self.task.key,
            "attempt": self.claimed.attempt,
            "agent": {"name": self.run.agent_name, "version": self.run.agent_version.version if self.run.agent_version else None},
            "instructions": str(self.manifest.get("instructions", "")),
            "failures": list(self.manifest.get("failures", [])),
            "input": self.run.input,
            "tools": self.tool_schemas(),
            "builtins": [
                *(["oz.fail"] if self.offers_fail else []),
                "oz.ask",
                "oz.approval",
                *(name for name in self.tools if name in kernel.DELEGATE_TOOLS),
            ],
            **journal,
            # The session's span, for the harness's own spans (W3C trace context; only when traced).
            **tracing.carrier(self.trace_context),
        }

    def checkpoint(self, state: Any) -> None:
        """The harness's own state now (protocol 2's `checkpoint`): kept on the round with the place in
        the journal it was taken at, for a session started again to resume from. One too big to
        keep is let go: that session starts from the beginning, its calls answered from the journal."""
        with self.journal.lock:
            self.resumable = kernel.round_checkpoint(self.claimed, state, at=self.journal.at)
            if self.resumable:
                self.state["journal_checkpoint"] = {"at": self.journal.at, "state": state}

    def resumed(self) -> None:
        """The harness resumed from the checkpoint `start.resume` handed it (protocol 2's `resumed`)."""
        with self.journal.lock:
            try:
                self.journal.resume(self.claimed)
            except ClaimGone:
                raise HarnessCanceled() from None
        self.resumable = True

    def model_requested(self) -> None:
        """The harness reported a model request: a checkpoint taken before it no longer holds it."""
        self.resumable = False

    def journal_start(self) -> list[dict[str, Any]]:
        """The calls an earlier session of the round made that will answer from their records when
        made again in this order: `{tool, digest, result}`, `result` as a `result` message holds it
        (without `id`). It stops at the first call that would run again, or is still unsettled."""
        entries = []
        for entry in self.journal.replayable_prefix():
            task = entry["task"]
            if not _settled(task):
                break
            result = answer_of(task).as_message(0)
            del result["type"], result["id"]
            entries.append({"tool": entry["tool"], "digest": entry["digest"], "result": result})
        return entries

    def prompt(self) -> str:
        """The job as one user message, for frameworks that take a prompt."""
        if self.run.input is None:
            return "Begin."
        return self.run.input if isinstance(self.run.input, str) else json.dumps(self.run.input, sort_keys=True)

    def canceled(self) -> bool:
        return self.cancel.is_set()

    def check_canceled(self) -> None:
        if self.cancel.is_set():
            raise HarnessCanceled()

    def check_stopping(self) -> None:
        """Ask the database, not only the heartbeat, whether the round must stop: its run is being
        canceled, a stop was asked of it, or its claim is gone. Then `HarnessCanceled`."""
        row = Task.objects.filter(pk=self.task.pk).values_list("status", "claim", "cancel_requested", "run__status").first()
        if row is None or row[0] != TaskStatus.RUNNING or row[1] != self.claimed.claim or row[2] or row[3] == RunStatus.CANCELING:
            self.cancel.set()
            raise HarnessCanceled()

    def bill(self, usage: Mapping[str, Any] | None, *, calls: int = 1) -> None:
        """Add the tokens a framework reports (`calls`: how many model requests they cover)."""
        if not usage:
            return
        for key in ("input_tokens", "output_tokens"):
            value = usage.get(key, 0)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                self.usage[key] += value
        self.usage["calls"] += max(0, int(calls))

    def extra(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"usage": dict(self.usage), "harness": self.harness.get("kind")}
        if self.code_digest:
            extra["code_digest"] = self.code_digest
        if self.provider_calls:
            extra["provider_calls"] = [dict(call) for call in self.provider_calls]
        stderr = self.stderr_source() if self.stderr_source is not None and not self.stderr else self.stderr
        if stderr:
            extra["stderr"] = stderr[-STDERR_KEPT:]
        return extra

    def call_tool(self, name: Any, args: Any) -> CallResult:
        if name == "oz.fail":
            return refused("oz.fail is not in this agent's `tools:`, so it cannot end the job with a failure kind")
        if not isinstance(name, str) or not name or (name.startswith("oz.") and name not in kernel.DELEGATE_TOOLS):
            return refused(f"{name!r} is not a tool this agent may call through oz0")
        if not isinstance(args, Mapping):
            return refused("the call's args are not an object")
        return self._authored({"tool": name, "args": dict(args)})

    def ask(self, question: Any) -> CallResult:
        return self._authored({"ask": question})

    def approval(self, tool: Any, args: Any) -> CallResult:
        """May the framework run its own tool `tool` with `args`? Granted: `{"approved": true,
        "digest"}`; denied (or expired): the failure, in the approver's or the rules' words."""
        if not isinstance(tool, str) or not tool.strip() or tool.startswith("oz."):
            return refused(f"{tool!r} names no tool of the agent's own to approve")
        if not isinstance(args, Mapping):
            return refused("the call's args are not an object")
        return self._authored({"native": tool, "args": dict(args)})

    def fail(self, kind: Any, message: Any) -> None:
        """oz.fail: the kernel decides declared or undeclared and refuses a message over the cap; the
        job ends either way (a refused oz.fail fails the round, as in oz0's own loop). An agent that
        does not list oz.fail was never offered it: this returns, and the caller answers the call as
        any other, which `call_tool` refuses (round_expansion_refused), so the agent goes on."""
        if not self.offers_fail:
            return
        kernel.round_oz_fail(self.claimed, kind, message, extra=self.extra(), state=self.state)
        raise JobEnded()

    def _authored(self, call: dict[str, Any]) -> CallResult:
        self.check_canceled()
        with self.journal.lock:
            try:
                key = self.journal.replay(self.claimed, call)
            except ClaimGone:
                raise HarnessCanceled() from None
            if key is None:
                key, refusal = kernel.round_call(
                    self.claimed,
                    call,
                    allowed_tools=self.tools,
                    tool_policies=dict(self.manifest.get("tool_on_failure", {})),
                    tool_timeouts=dict(self.manifest.get("tool_timeouts", {})),
                    journal_at=self.journal.at,
                )
                if refusal is not None:
                    return refused(refusal)
                if key is None:
                    raise HarnessCanceled()  # the claim is gone or the run stops
                self.journal.made(key)
            # max: a framework may run calls in parallel threads, and their reports may come back out of order.
            self.state["authored"] = max(int(self.state.get("authored", 0)), int(key.rsplit(".", 1)[1]))
            self._carry_noted()
        return self._answer(key)

    def _carry_noted(self) -> None:
        """The kernel notes the non-replayable calls and the journal on the round (kernel.round_call,
        kernel.round_replayed); the session's report replaces the round's state, so it carries them on."""
        noted = Task.objects.filter(pk=self.task.pk).values_list("state", flat=True).first() or {}
        if noted.get("nonreplayable_calls"):
            self.state["nonreplayable_calls"] = sorted(
                {*self.state.get("nonreplayable_calls", []), *noted["nonreplayable_calls"]},
                key=lambda k: int(k.rsplit(".", 1)[1]),
            )
        for name in JOURNAL_STATE_KEYS:
            if name in noted:
                self.state[name] = noted[name]
            else:
                self.state.pop(name, None)

    def answer(self, key: str) -> CallResult:
        """The answer to the call `key` a released session waited on, once it is given a thread again."""
        return self._answer(key)

    def _answer(self, key: str) -> CallResult:
        """Wait for the call `key` to settle; its answer for the agent. A wait on a person longer
        than OZ0_SESSION_PARK_SECONDS parks the session, if it can be (`HarnessParked`), else
        releases it, if it can be (`HarnessReleased`); a wait in a worker told to stop parks it
        at once, if it can be."""
        asking_since: float | None = None
        while True:
            source = Task.objects.filter(run_id=self.run.pk, key=key).first()
            if source is None:
                return refused(f"{key}, the call, is gone")
            if _settled(source):
                break
            # Parked, never released, for the stop: the keeper that would hold its process stops too.
            # Until its checkpoint has come (`_park` is False without one), it waits on as before.
            if source.status in TASK_ASKING and self.parks and worker_stopping.is_set() and self._park(key):
                raise HarnessParked()
            if source.status in TASK_ASKING and (self.parks or self.releases):
                now = time.monotonic()
                asking_since = now if asking_since is None else asking_since
                if now - asking_since >= float(settings.OZ0_SESSION_PARK_SECONDS):
                    if self.parks and self._park(key):
                        raise HarnessParked()
                    if self.releases and self._release(key):
                        raise HarnessReleased(key, source.pk)
                    asking_since = now  # not parked now (see _park): asked again a park clock later
            if self.cancel.wait(POLL_SECONDS):
                raise HarnessCanceled()
        # A cancel settles the calls it stops at once, before the heartbeat carries it here: the
        # harness is told `cancel`, never handed the stopped call's failure to answer around.
        self.check_stopping()
        return answer_of(source)

    def _park(self, key: str) -> bool:
        """Park the session on `key` when its harness can resume from its checkpoint (see the
        module's docstring). False: it goes on waiting (the call was decided meanwhile, or there
        is nothing to resume from)."""
        if not self.resumable or self.cancel.is_set():
            return False
        with self.journal.lock:
            return kernel.round_park(self.claimed, on=key, at=self.journal.at, extra=self.extra(), state=self.state)

    def _release(self, key: str) -> bool:
        """Release the session's thread while it waits on `key` (its process kept): False when the
        call was decided meanwhile, the run stops, or the claim is gone."""
        if self.cancel.is_set():
            return False
        with self.journal.lock:
            return kernel.round_release(self.claimed, on=key)


def answer_of(source: Task) -> CallResult:
    """A settled call's answer, as the agent reads it."""
    if source.kind == "await" and source.status == TaskStatus.COMPLETED:
        return CallResult(ok=True, value=(source.result or {}).get("value"))
    message = child_message(source) if source.kind == "delegate" else tool_message(source)
    if message["ok"]:
        return CallResult(ok=True, value=(source.result or {}).get("value"))
    return CallResult(ok=False, failure=json.loads(message["content"]))
