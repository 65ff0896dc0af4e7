"""`chaos`: oz0 under load while its processes and services fail, one fault at a time.

A stack of its own (bench/chaos_stack.py: its own PostgreSQL and Redis, web, two workers of 2 slots,
the session worker, beat) runs the workload of each phase: `runs` runs of 23 tasks (15 quick
`test.echo`, a `test.sleep`, a replayable `test.effect_replayable` and a non-replayable
`test.effect` that stay in flight a while, a script round whose call needs approval in a quarter of
the runs, and the joins). Half the runs are created before the fault and half while it lasts, each
create with an `Idempotency-Key` and retried by the client on any error; pending approvals are
approved or denied as they show up, during the fault too. The fault is injected once calls are in
flight; then the phase waits until every run has settled (completed, or waiting for a person) and
reads the figures from the stack's database:

- runs completed, and waiting for a person (held, an `uncertain` call whose holder died among them);
- runs stuck (neither, when the phase gives up), and tasks lost (accepted, never settled);
- non-replayable effects above one (a `test.effect` executed twice);
- replayable calls run twice at once (two executions overlapping by more than two heartbeats, not
  counting the time a holder was stopped), and leases taken from live holders (a claim expired
  in a phase where no holder died or stopped);
- false failures (a failed or timed-out task other than a denied approval, or an `uncertain` one
  where no holder died or stopped);
- 5xx answers to requests that committed (a create whose key, or an approval whose verb, is in
  the database from before the answer), and runs started twice (two runs of one create's key);
- the worst time from a holder's last heartbeat to the sweep acting on its expired claim (goal:
  within the lease plus two sweep periods), and the refused late reports (`lease_lost`);
- the seconds from the fault to the last run settled.

Faults, one per phase: a worker's pool children killed; a whole worker killed (and started again
a second later, as `./oz0 up`'s supervisor does); Redis killed for `redis_down` seconds (its data
lost); PostgreSQL killed (every server process at once) for `postgres_down` seconds, then the same
stopped (SIGSTOP); beat killed for `beat_down` seconds; a worker stopped (SIGSTOP) past its lease,
then resumed; the session worker killed while sessions wait on their calls.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx

from bench.chaos_stack import Stack, Timing, say, wait_until

EFFECT_TABLE = "testtools_effectrecord"
SETTLED_RUNS = ("completed", "canceled", "needs_attention")
LIVE_TASKS = ("running", "dispatched", "needs_approval")


@dataclass(frozen=True)
class ChaosProfile:
    name: str
    timing: Timing
    runs: int  # per phase
    stay: float  # how long the long calls stay in flight, seconds
    redis_down: float
    postgres_down: float
    beat_down: float
    settle: float  # the longest a phase waits for its runs to settle after the fault

    @property
    def stop_past_lease(self) -> float:
        return self.timing.lease + 2 * self.timing.sweep + 3

    @property
    def lease_bound(self) -> float:
        """A dead holder's call moves on within this long of its last heartbeat."""
        return self.timing.lease + 2 * self.timing.sweep


PROFILES = {
    # Production's clocks (OZ0_LEASE_SECONDS 30, heartbeat 1 s, sweeps every 2 s).
    "full": ChaosProfile(
        "full", Timing(30, 1, 2, 15), runs=20, stay=4, redis_down=20, postgres_down=10, beat_down=60, settle=300
    ),
    # The slow test's: a short lease (as the live tests use), so a phase waits seconds, not a minute.
    "test": ChaosProfile(
        "test", Timing(5, 0.5, 0.5, 3), runs=20, stay=2, redis_down=20, postgres_down=10, beat_down=20, settle=150
    ),
}


# ---------------------------------------------------------------------------
# the client: creates (keyed, retried), approvals, every answer recorded
# ---------------------------------------------------------------------------


@dataclass
class Answer:
    what: str  # create | approve | deny
    ref: str  # the create's key (its run's tag), or "<run>/<task>"
    status: int  # 0: no answer (the connection failed or timed out)
    at: float  # time.time() when the answer came


class Client:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.http = httpx.Client(
            base_url=f"{stack.base_url}/api/v1", headers={"Authorization": f"Bearer {stack.token}"}, timeout=20
        )
        self.answers: list[Answer] = []
        self.lock = threading.Lock()

    def close(self) -> None:
        self.http.close()

    def call(self, method: str, path: str, body: Any = None, *, key: str | None = None) -> tuple[int, Any]:
        headers = {"Idempotency-Key": key} if key else {}
        try:
            response = self.http.request(method, path, json=body, headers=headers)
        except httpx.HTTPError:
            return 0, None
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, None

    def record(self, what: str, ref: str, status: int) -> None:
        with self.lock:
            self.answers.append(Answer(what, ref, status, time.time()))

    def create(self, tag: str, body: dict[str, Any], until: float) -> str | None:
        """Create a run, retrying on any error with the same key, as a careful client does."""
        delay = 0.2
        while time.monotonic() < until:
            status, data = self.call("POST", f"/workspaces/{self.stack.workspace}/runs", body, key=tag)
            self.record("create", tag, status)
            if status == 201:
                return str(data["run"]["id"])
            if 400 <= status < 500 and status not in (408, 429):
                raise RuntimeError(f"chaos: the workload's create was refused: {status} {data}")
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
        return None

    def decide_pending(self, runs: set[str]) -> None:
        """Approve or deny (alternately) the phase's calls waiting for approval."""
        status, data = self.call("GET", f"/inbox?workspace={self.stack.workspace}&kind=approval")
        if status != 200:
            return
        for item in data.get("items", []):
            run, task = str(item.get("run")), str(item.get("task"))
            if run not in runs:
                continue
            verb = "approve" if int(run.replace("-", ""), 16) % 2 else "deny"
            body = {"reason": "chaos"} if verb == "deny" else {}
            answer, _ = self.call("POST", f"/runs/{run}/tasks/{task}/{verb}", body)
            self.record(verb, f"{run}/{task}", answer)


def run_body(tag: str, index: int, stay: float) -> dict[str, Any]:
    """One run of the workload: 22 tasks authored by the client, the 23rd by its script round."""
    echoes = [f"q{n}" for n in range(15)]
    tasks: list[dict[str, Any]] = [
        {"key": k, "kind": "tool", "tool": "test.echo", "args": {"value": n}} for n, k in enumerate(echoes)
    ]
    tasks += [
        {"key": "s0", "kind": "tool", "tool": "test.sleep", "args": {"seconds": stay / 2}},
        {"key": "rep", "kind": "tool", "tool": "test.effect_replayable", "args": {"id": f"{tag}-rep", "seconds": stay}},
        {"key": "eff", "kind": "tool", "tool": "test.effect", "args": {"id": f"{tag}-eff", "seconds": stay}},
        {
            "key": "r1",
            "kind": "round",
            "model": "script",
            "prompt": "go",
            "script": [{"tool_calls": [{"tool": "test.echo", "args": {"value": tag}}]}, {"text": "done"}],
        },
        {"key": "jq", "kind": "join", "mode": "all", "after": echoes},
        {"key": "jl", "kind": "join", "mode": "all", "after": ["s0", "rep", "eff"]},
        {"key": "done", "kind": "join", "mode": "all", "after": ["jq", "jl", "r1"]},
    ]
    approval = {"mode": "ask" if index % 4 == 0 else "bypass"}
    return {"tasks": tasks, "deliverable": "done", "approval": approval, "input": {"tag": tag}}


SESSION_AGENT = {
    "name": "chaos-session",
    "instructions": "Wait on one call, then answer.",
    "harness": {"jsonl": {"program": "chaos-session"}},
    "tools": ["test.sleep"],
    "approval": {"mode": "bypass"},
}


def session_body(tag: str, stay: float) -> dict[str, Any]:
    return {"agent": SESSION_AGENT["name"], "input": {"tag": tag, "seconds": stay}}


# ---------------------------------------------------------------------------
# faults
# ---------------------------------------------------------------------------


@dataclass
class Injected:
    """What a fault did: when holders were stopped (their executions do not count as running)."""

    frozen: list[tuple[float, float]] = field(default_factory=list)


@dataclass(frozen=True)
class Fault:
    slug: str
    title: str
    inject: Callable[[Stack, ChaosProfile], Injected]
    holders_die: bool = False  # a call's holder dies or stops: `uncertain` and expired claims are the truth
    sessions: bool = False  # the phase's workload has harnessed sessions
    on_worker_a: bool = False  # it strikes worker-a: wait until worker-a holds a long call


def _worker_children(stack: Stack, profile: ChaosProfile) -> Injected:
    for child in stack.children("worker-a"):
        child.send_signal(signal.SIGKILL)
    return Injected()


def _whole_worker(stack: Stack, profile: ChaosProfile) -> Injected:
    stack.kill("worker-a")
    time.sleep(1)
    stack.start("worker-a")
    return Injected()


def _redis(stack: Stack, profile: ChaosProfile) -> Injected:
    stack.redis.kill()
    time.sleep(profile.redis_down)
    stack.redis.start()
    return Injected()


def _postgres_killed(stack: Stack, profile: ChaosProfile) -> Injected:
    stack.postgres.kill()
    time.sleep(profile.postgres_down)
    stack.postgres.restart()
    return Injected()


def _postgres_stopped(stack: Stack, profile: ChaosProfile) -> Injected:
    stack.postgres.signal(signal.SIGSTOP)
    time.sleep(profile.postgres_down)
    stack.postgres.signal(signal.SIGCONT)
    return Injected()


def _beat(stack: Stack, profile: ChaosProfile) -> Injected:
    stack.kill("beat")
    time.sleep(profile.beat_down)
    stack.start("beat")
    return Injected()


def _stopped_worker(stack: Stack, profile: ChaosProfile) -> Injected:
    stopped = time.time()
    stack.signal_group("worker-a", signal.SIGSTOP)
    time.sleep(profile.stop_past_lease)
    stack.signal_group("worker-a", signal.SIGCONT)
    return Injected(frozen=[(stopped, time.time())])


def _sessions(stack: Stack, profile: ChaosProfile) -> Injected:
    stack.kill("sessions")
    time.sleep(1)
    stack.start("sessions")
    return Injected()


FAULTS = (
    Fault("children", "worker children killed", _worker_children, holders_die=True, on_worker_a=True),
    Fault("worker", "whole worker killed", _whole_worker, holders_die=True, on_worker_a=True),
    Fault("redis", "Redis killed", _redis),
    Fault("pg-kill", "PostgreSQL killed", _postgres_killed),
    Fault("pg-stop", "PostgreSQL stopped", _postgres_stopped),
    Fault("beat", "beat stopped", _beat),
    Fault("stop", "a worker stopped past its lease", _stopped_worker, holders_die=True, on_worker_a=True),
    Fault("session", "session worker killed mid-session", _sessions, holders_die=True, sessions=True),
)


def fault_title(fault: Fault, profile: ChaosProfile) -> str:
    seconds = {
        "redis": profile.redis_down,
        "pg-kill": profile.postgres_down,
        "pg-stop": profile.postgres_down,
        "beat": profile.beat_down,
        "stop": profile.stop_past_lease,
    }.get(fault.slug)
    return f"{fault.title} ({seconds:g} s)" if seconds else fault.title


# ---------------------------------------------------------------------------
# a phase
# ---------------------------------------------------------------------------


@dataclass
class PhaseResult:
    fault: str
    runs: int = 0
    completed: int = 0
    waiting_for_person: int = 0
    stuck: int = 0
    tasks_lost: int = 0
    effects_above_one: int = 0
    replayed_at_once: int = 0
    leases_taken_from_live_holders: int = 0
    false_failures: int = 0
    committed_5xx: int = 0
    started_twice: int = 0
    answers_5xx: int = 0
    expired_claims: int = 0
    worst_lease_seconds: float | None = None
    lease_bound_seconds: float = 0.0
    lease_lost: int = 0
    settled_seconds: float | None = None
    notes: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        """What breaks the goal: 0 lost, 0 duplicated, 0 false failures, 0 stuck, leases on time."""
        checks = {
            "stuck runs": self.stuck,
            "tasks lost": self.tasks_lost,
            "non-replayable effects above one": self.effects_above_one,
            "replayable calls run twice at once": self.replayed_at_once,
            "leases taken from live holders": self.leases_taken_from_live_holders,
            "false failures": self.false_failures,
            "5xx answers to committed requests": self.committed_5xx,
            "runs started twice": self.started_twice,
        }
        found = [f"{name}: {value}" for name, value in checks.items() if value]
        if self.worst_lease_seconds is not None and self.worst_lease_seconds > self.lease_bound_seconds:
            found.append(f"an expired lease acted on {self.worst_lease_seconds:.1f}s after its last heartbeat")
        return found


def _stamp(value: Any) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value)).timestamp()


def _active(start: float, end: float, frozen: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """[start, end] less the windows its holder may have been stopped in."""
    pieces = [(start, end)]
    for f_start, f_end in frozen:
        cut: list[tuple[float, float]] = []
        for a, b in pieces:
            if f_end <= a or f_start >= b:
                cut.append((a, b))
                continue
            if a < f_start:
                cut.append((a, f_start))
            if f_end < b:
                cut.append((f_end, b))
        pieces = cut
    return pieces


def _overlap(first: list[tuple[float, float]], second: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(b1, b2) - max(a1, a2)) for a1, b1 in first for a2, b2 in second)


class Phase:
    def __init__(self, stack: Stack, client: Client, profile: ChaosProfile, fault: Fault) -> None:
        self.stack, self.client, self.profile, self.fault = stack, client, profile, fault
        self.prefix = f"{fault.slug}-{uuid.uuid4().hex[:6]}-"
        self.tags = [f"{self.prefix}{i:02d}" for i in range(profile.runs)]
        self.sessions = set(self.tags[: max(2, profile.runs // 4)]) if fault.sessions else set()
        self.run_ids: set[str] = set()
        self.done = threading.Event()

    def body(self, tag: str) -> dict[str, Any]:
        if tag in self.sessions:
            return session_body(tag, self.profile.stay * 3)
        return run_body(tag, self.tags.index(tag), self.profile.stay)

    def _create(self, tags: list[str], until: float) -> None:
        for tag in tags:
            run = self.client.create(tag, self.body(tag), until)
            if run is not None:
                self.run_ids.add(run)

    def _decide(self) -> None:
        while not self.done.wait(0.5):
            self.client.decide_pending(self.run_ids)

    def in_flight(self) -> bool:
        """Calls are in flight: some long calls (or sessions' calls) have started and run still."""
        if self.sessions:
            sql = (
                "SELECT count(*) FROM runs_task t JOIN runs_run r ON r.id = t.run_id "
                "WHERE r.input->>'tag' = ANY(%s) AND t.key LIKE 'r1.%%' AND t.status = 'running'"
            )
            return self.stack.query(sql, (sorted(self.sessions),))[0][0] >= 2
        sql = (
            "SELECT t.key, t.claim FROM runs_task t JOIN runs_run r ON r.id = t.run_id "
            "WHERE r.input->>'tag' = ANY(%s) AND t.key IN ('eff', 'rep') AND t.status = 'running'"
        )
        claims = self.stack.query(sql, (self.tags,))
        if self.fault.on_worker_a:
            # worker-a holds a non-replayable call: what becomes of it is the phase's question.
            pids = {str(p.pid) for p in self.stack.children("worker-a")}
            return any(key == "eff" and claim and claim.split(":")[1] in pids for key, claim in claims)
        return len(claims) >= 2

    def unsettled(self) -> int:
        sql = """
            SELECT count(*) FROM runs_run r WHERE r.input->>'tag' = ANY(%s) AND (
              r.status NOT IN ('completed', 'canceled', 'needs_attention')
              OR EXISTS (SELECT 1 FROM runs_task t WHERE t.run_id = r.id
                         AND (t.status IN ('running', 'dispatched', 'needs_approval') OR (t.status = 'waiting' AND t.ready))))
        """
        try:
            return int(self.stack.query(sql, (self.tags,))[0][0])
        except Exception:
            return -1  # the database is away: not settled

    def run(self) -> PhaseResult:
        profile, fault = self.profile, self.fault
        say(f"phase: {fault_title(fault, profile)}")
        half = len(self.tags) // 2
        self._create(self.tags[:half], time.monotonic() + 60)
        wait_until(self.in_flight, timeout=60, interval=0.1, what="calls in flight")
        deadline = time.monotonic() + profile.settle + 120
        during = threading.Thread(target=self._create, args=(self.tags[half:], deadline), daemon=True)
        decider = threading.Thread(target=self._decide, daemon=True)
        fault_at = time.time()
        during.start()
        decider.start()
        injected = fault.inject(self.stack, profile)
        say(f"  fault over after {time.time() - fault_at:.1f}s; waiting for the runs to settle")
        during.join(timeout=profile.settle + 130)
        settle_by = time.monotonic() + profile.settle
        while time.monotonic() < settle_by and (len(self.run_ids) < len(self.tags) or self.unsettled() != 0):
            time.sleep(0.5)
        self.done.set()
        decider.join(timeout=30)
        result = self.measure(fault_at, injected)
        say(
            f"  {result.completed} completed, {result.waiting_for_person} waiting for a person, {result.stuck} stuck; "
            f"settled {result.settled_seconds}s after the fault"
            + (f"; PROBLEMS: {result.problems()}" if result.problems() else "")
        )
        return result

    # ---- the figures ----
    def measure(self, fault_at: float, injected: Injected) -> PhaseResult:
        stack, profile, fault = self.stack, self.profile, self.fault
        result = PhaseResult(fault_title(fault, profile), lease_bound_seconds=profile.lease_bound)
        wait_until(stack.database_answers, timeout=60, what="the stack's database")
        rows = stack.query("SELECT id::text, status, input->>'tag' FROM runs_run WHERE input->>'tag' = ANY(%s)", (self.tags,))
        result.runs = len({tag for _, _, tag in rows})
        by_tag: dict[str, int] = {}
        for _, _, tag in rows:
            by_tag[tag] = by_tag.get(tag, 0) + 1
        result.started_twice = sum(n - 1 for n in by_tag.values())
        result.notes += [f"run {tag} never created" for tag in self.tags if tag not in by_tag]
        result.completed = sum(1 for _, status, _ in rows if status == "completed")
        result.waiting_for_person = sum(1 for _, status, _ in rows if status == "needs_attention")
        result.stuck = sum(1 for _, status, _ in rows if status not in SETTLED_RUNS) + (len(self.tags) - result.runs)
        ids = [run_id for run_id, _, _ in rows]
        lost = stack.query(
            "SELECT count(*) FROM runs_task WHERE run_id::text = ANY(%s) AND (status IN ('running', 'dispatched') "
            "OR (status = 'waiting' AND ready))",
            (ids,),
        )
        result.tasks_lost = int(lost[0][0])
        # Failures that are no failure of the call's: a denied approval is the person's word.
        failed = stack.query(
            "SELECT key, status, error_key FROM runs_task WHERE run_id::text = ANY(%s) AND status IN ('failed', 'timed_out', 'uncertain')",
            (ids,),
        )
        for key, status, error_key in failed:
            if error_key == "approval_denied":
                continue
            if status == "uncertain" and fault.holders_die:
                continue
            result.false_failures += 1
            result.notes.append(f"{key} {status} ({error_key})")
        effects = stack.query(
            f"SELECT effect_id, replayable, at, finished_at FROM {EFFECT_TABLE} WHERE effect_id LIKE %s ORDER BY at",
            (f"{self.prefix}%",),
        )
        executions: dict[str, list[tuple[float, float | None]]] = {}
        for effect_id, replayable, at, finished_at in effects:
            if not replayable:
                executions.setdefault(f"n:{effect_id}", []).append((_stamp(at), None))
            else:
                executions.setdefault(f"r:{effect_id}", []).append((_stamp(at), _stamp(finished_at) if finished_at else None))
        margin = 2 * profile.timing.heartbeat
        for name, runs in executions.items():
            if name.startswith("n:"):
                result.effects_above_one += max(0, len(runs) - 1)
                continue
            for i, (start, end) in enumerate(runs):
                for later_start, later_end in runs[i + 1 :]:
                    if end is None or later_end is None:
                        continue  # a worker died in it, or its end could not be stamped
                    if _overlap(_active(start, end, injected.frozen), _active(later_start, later_end, injected.frozen)) > margin:
                        result.replayed_at_once += 1
        expired = stack.query(
            "SELECT at, data FROM runs_traceevent WHERE run_id::text = ANY(%s) AND event = 'claim_expired'", (ids,)
        )
        result.expired_claims = len(expired)
        lateness = [
            _stamp(at) - _stamp(data["heartbeat_at"])
            for at, data in expired
            if isinstance(data, dict) and data.get("heartbeat_at")
        ]
        result.worst_lease_seconds = round(max(lateness), 2) if lateness else None
        if not fault.holders_die:
            result.leases_taken_from_live_holders = len(expired)
            if expired:
                result.notes += self._live_holders_heard(ids, fault_at)
        result.lease_lost = int(
            stack.query("SELECT count(*) FROM runs_traceevent WHERE run_id::text = ANY(%s) AND event = 'lease_lost'", (ids,))[0][
                0
            ]
        )
        last = stack.query("SELECT max(at) FROM runs_traceevent WHERE run_id::text = ANY(%s)", (ids,))[0][0]
        result.settled_seconds = round(_stamp(last) - fault_at, 1) if last is not None else None
        self._committed_5xx(result)
        return result

    def _live_holders_heard(self, ids: list[str], fault_at: float) -> list[str]:
        """For each lease the sweep took from a holder that did not die: when it was last heard and
        when it was taken (seconds after the fault began), and what the processes logged of its
        task meanwhile, so that a failure explains itself."""
        taken = self.stack.query(
            "SELECT t.id, e.task_key, e.at, e.data FROM runs_traceevent e JOIN runs_task t "
            "ON t.run_id = e.run_id AND t.key = e.task_key WHERE e.run_id::text = ANY(%s) AND e.event = 'claim_expired'",
            (ids,),
        )
        logs = {name: self.stack.log(name, 2_000_000).splitlines() for name in self.stack.processes}
        notes = []
        for task_id, key, at, data in taken:
            heard = data.get("heartbeat_at") if isinstance(data, dict) else None
            last = f"{_stamp(heard) - fault_at:.1f}s" if heard else "never"
            notes.append(f"lease of {key} (task {task_id}) taken at {_stamp(at) - fault_at:.1f}s, last heard at {last}")
            mark = f"task {task_id}"
            for name, lines in logs.items():
                notes += [f"  {name}: {line}" for line in [line for line in lines if mark in line][-12:]]
        return notes

    def _committed_5xx(self, result: PhaseResult) -> None:
        """A 5xx answer to a request whose work was committed before the answer came."""
        answers = [a for a in self.client.answers if a.status >= 500]
        result.answers_5xx = len(answers)
        for answer in answers:
            if answer.what == "create":
                rows = self.stack.query("SELECT created_at FROM runs_idempotencykey WHERE key = %s", (answer.ref,))
                committed = bool(rows) and _stamp(rows[0][0]) <= answer.at
            else:
                run, task = answer.ref.split("/", 1)
                rows = self.stack.query(
                    "SELECT at FROM runs_traceevent WHERE run_id::text = %s AND task_key = %s AND event = 'verb' AND data->>'verb' = %s",
                    (run, task, answer.what),
                )
                committed = any(_stamp(at) <= answer.at for (at,) in rows)
            if committed:
                result.committed_5xx += 1
                result.notes.append(f"{answer.what} {answer.ref} answered {answer.status} but committed")


# ---------------------------------------------------------------------------
# the whole run
# ---------------------------------------------------------------------------


def register_session_agent(client: Client, stack: Stack) -> None:
    status, data = client.call("POST", f"/workspaces/{stack.workspace}/agents", {"manifest": json.dumps(SESSION_AGENT)})
    if status not in (200, 201):
        raise RuntimeError(f"chaos: the session agent was not registered: {status} {data}")


def missing(stack: Stack) -> list[str]:
    """What of the stack is not whole: processes that exited (with their codes), the web server not
    listening, the database or Redis not answering. Empty when the stack is whole."""
    gaps = [f"{name} exited with {process.returncode}" for name, process in stack.processes.items() if process.poll() is not None]
    if not stack.listening():
        gaps.append("the web server is not listening")
    if not stack.database_answers():
        gaps.append("PostgreSQL does not answer")
    if not stack.redis.pings():
        gaps.append("Redis does not answer")
    return gaps


def wait_whole(stack: Stack, after: str, timeout: float = 120) -> None:
    """Until the stack is whole again; on a timeout the error names what is missing after which
    fault, with the end of each exited process's log (a test's summary shows the error alone)."""
    deadline = time.monotonic() + timeout
    while gaps := missing(stack):
        if time.monotonic() > deadline:
            logs = "".join(
                f"\n--- the end of {name}'s log ---\n{stack.log(name, 1500)}"
                for name, process in stack.processes.items()
                if process.poll() is not None
            )
            raise TimeoutError(f"chaos: the stack was not whole {timeout:.0f}s after {after}: {'; '.join(gaps)}{logs}")
        time.sleep(0.2)


def run_faults(profile: ChaosProfile, only: list[str] | None = None, stack: Stack | None = None) -> list[PhaseResult]:
    """Every fault (or the slugs in `only`), one phase each, on a stack of its own (or the one given)."""
    own = stack is None
    stack = stack or Stack(profile.timing)
    results: list[PhaseResult] = []
    try:
        if own:
            stack.up()
        client = Client(stack)
        try:
            register_session_agent(client, stack)
            after = "the stack's start"
            for fault in FAULTS:
                if only and fault.slug not in only:
                    continue
                wait_whole(stack, after)
                results.append(Phase(stack, client, profile, fault).run())
                after = f"the fault {fault.slug!r}"
                client.answers.clear()
        except BaseException:
            for name in ("web", *stack.WORKERS, "sessions", "beat"):
                say(f"--- the end of {name}'s log ---\n{stack.log(name, 3000)}")
            raise
        finally:
            client.close()
    finally:
        if own:
            stack.down()
    return results


COLUMNS = (
    ("fault", "fault"),
    ("completed", "runs completed"),
    ("waiting_for_person", "waiting for a person"),
    ("stuck", "stuck"),
    ("tasks_lost", "tasks lost"),
    ("effects_above_one", "non-replayable effects above one"),
    ("replayed_at_once", "replayable run twice at once"),
    ("false_failures", "false failures"),
    ("answers_5xx", "5xx answers"),
    ("committed_5xx", "5xx to committed requests"),
    ("started_twice", "runs started twice"),
    ("worst_lease_seconds", "worst expired lease acted on (s)"),
    ("lease_lost", "late reports refused"),
    ("settled_seconds", "fault → all settled (s)"),
)


def markdown(results: list[PhaseResult], profile: ChaosProfile) -> str:
    lines = ["| " + " | ".join(title for _, title in COLUMNS) + " |", "|---" + "|---:" * (len(COLUMNS) - 1) + "|"]
    for result in results:
        cells = []
        for name, _ in COLUMNS:
            value = getattr(result, name)
            cells.append("–" if value is None else (f"{value:g}" if isinstance(value, float) else str(value)))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        f"{profile.runs} runs of 23 tasks per fault; lease {profile.timing.lease:g} s, heartbeat {profile.timing.heartbeat:g} s, "
        f"sweeps every {profile.timing.sweep:g} s (an expired lease is due within {profile.lease_bound:g} s of the last heartbeat)."
    )
    return "\n".join(lines)


def run(profile_name: str) -> Any:
    """`./oz0 bench --only chaos`: the faults on production's clocks; a bench Section."""
    from bench.harness import Section, goal_at_most, summary

    profile = PROFILES["full" if profile_name == "full" else "test"]
    results = run_faults(profile)
    section = Section()
    for result in results:
        for name, title in COLUMNS[1:]:
            value = getattr(result, name)
            if value is not None:
                section.figures[f"{result.fault[:30]}: {title}"[:44]] = summary([float(value)], "")
    totals = {
        "tasks lost": sum(r.tasks_lost for r in results),
        "non-replayable effects above one": sum(r.effects_above_one for r in results),
        "replayable calls run twice at once": sum(r.replayed_at_once for r in results),
        "false failures": sum(r.false_failures + r.leases_taken_from_live_holders for r in results),
        "stuck runs": sum(r.stuck for r in results),
        "5xx answers to committed requests": sum(r.committed_5xx for r in results),
    }
    for name, value in totals.items():
        section.goals.append(goal_at_most(f"chaos: {name}", float(value), 0))
    worst = [r.worst_lease_seconds for r in results if r.worst_lease_seconds is not None]
    if worst:
        section.goals.append(goal_at_most("chaos: expired lease acted on (s)", max(worst), profile.lease_bound, " s"))
    section.notes.append("\n" + markdown(results, profile))
    section.notes += [f"{r.fault}: {note}" for r in results for note in r.notes]
    section.extra["phases"] = [r.__dict__ for r in results]
    return section
