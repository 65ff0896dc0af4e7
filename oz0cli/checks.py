"""`./oz0 test [--quick] [PYTEST ARGS]`: ruff, ruff format --check, makemigrations --check and mypy
(unless OZ0_SKIP_CHECKS), then pytest; one exit code for them all.

Without test paths, markers or keywords, the checks and the suite run side by side, the suite as
four pytest processes: the fault tests (each breaks a whole oz0 of its own), the other slow tests
(restarts and outages), the other tests that drive the live stack (a Celery worker, beat, daphne,
Chromium: mostly waiting on those processes) and the rest (mostly CPU, split over
pytest-xdist workers). Each has its own test database, and a live stack has its own broker queue,
so none sees another's rows or messages. `--quick` runs only the last kind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from oz0cli import ROOT, say
from oz0cli.environment import use_base_environment, use_bytecode_cache
from oz0cli.services import services

# The markers of tests that drive a stack; tests/conftest.py lets their lanes skip modules that name none.
ENGINE_MARKERS = ("live", "browser", "slow", "faults")
ENGINE_EXPRESSION = " or ".join(ENGINE_MARKERS)
# The rest lane of the whole suite; --quick leaves out the thorough tests too (fuzzing, property
# runs, walks of every page, whole-demo loads): a person's fast loop, the full suite keeps them.
REST_MARKERS = f"not ({ENGINE_EXPRESSION})"
QUICK_MARKERS = f"not ({ENGINE_EXPRESSION} or thorough)"
FAULTS_MARKERS = "faults"
SLOW_MARKERS = "slow and not faults"
LIVE_MARKERS = "(live or browser) and not (slow or faults)"
NO_TESTS_COLLECTED = 5


@dataclass(frozen=True)
class Lane:
    """One pytest process: its name (the prefix of its lines when lanes run side by side), its
    arguments after `pytest`, and what it adds to the environment."""

    name: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)


def checks_wanted(environ: Mapping[str, str]) -> bool:
    return environ.get("OZ0_SKIP_CHECKS", "") not in ("1", "true", "yes")


def check_commands(python: str) -> list[tuple[str, list[str]]]:
    """The static checks; which files ruff and mypy cover (the `./oz0` launcher too) is pyproject.toml's."""
    return [
        ("ruff check", [python, "-m", "ruff", "check"]),
        ("ruff format --check", [python, "-m", "ruff", "format", "--check"]),
        ("makemigrations --check", [python, "manage.py", "makemigrations", "--check", "--dry-run"]),
        ("mypy", [python, "-m", "mypy"]),
    ]


def selects_tests(args: list[str]) -> bool:
    """Whether the person chose tests: a path or node id, a marker expression, or a keyword."""
    takes_value = {"-m", "-k", "-p", "-o", "-c", "--rootdir", "--timeout", "--maxfail", "--tb", "-W", "--deselect"}
    skip_next = False
    for arg in args:
        if skip_next:
            skip_next = False
            continue
        if arg in ("-m", "-k") or arg.startswith(("-m=", "-k=", "--deselect")):
            return True
        if arg in takes_value:
            skip_next = True
            continue
        if not arg.startswith("-"):
            return True
    return False


def next_redis_database(url: str, step: int = 1) -> str:
    """The same Redis server, another of its 16 numbered databases (`redis://host/N`, `unix://path?db=N`)."""
    parts = urlsplit(url)
    if parts.scheme == "unix":  # urlunsplit would drop the empty host of unix:///path
        path, _, query_text = url.partition("?")
        query = dict(parse_qsl(query_text))
        number = query.get("db", "0")
        query["db"] = str(((int(number) if number.isdigit() else 0) + step) % 16)
        return f"{path}?{urlencode(query)}"
    number = parts.path.strip("/")
    following = ((int(number) if number.isdigit() else 0) + step) % 16
    return urlunsplit(parts._replace(path=f"/{following}"))


def xdist_workers(environ: Mapping[str, str]) -> int:
    """How many pytest-xdist workers split the rest of the tests: OZ0_TEST_WORKERS, else two per
    core, from two to six. Two per core because a worker spends much of its time waiting (on
    PostgreSQL, on the harness processes the framework tests start): on two cores the quick
    suite used 0.6 of a core with two workers."""
    chosen = environ.get("OZ0_TEST_WORKERS", "")
    if chosen.isdigit() and int(chosen) > 0:
        return int(chosen)
    return max(2, min(6, 2 * (os.cpu_count() or 1)))


def plan_lanes(args: list[str], *, quick: bool, environ: Mapping[str, str]) -> list[Lane]:
    """The pytest processes `./oz0 test` runs. A person's own selection runs as one process as
    given (with --quick, narrowed to the quick tests and split over xdist workers); the whole suite
    runs as four lanes: the fault tests (stacks of their own, broken on purpose: mostly waiting),
    the other slow ones, the other live ones (a worker, daphne, Chromium) and the rest (mostly CPU,
    over xdist workers, each of which tests/parallel_workers.py keeps apart in Redis). Their rows
    are apart by database; in Redis, numbered ids of the databases would meet (a workspace's
    membership stamp, the cache), so each engine lane takes another Redis database and a channel
    prefix of its own (pub/sub channels are shared by every Redis database)."""
    # worksteal: a worker that runs out takes queued tests from the others, so one long test near
    # the end no longer leaves three workers idle behind it.
    parallel = ["-n", str(xdist_workers(environ)), "--dist", "worksteal"]
    if quick:
        return [Lane("quick", ["-m", QUICK_MARKERS, *([] if selects_tests(args) else parallel), *args])]
    if selects_tests(args):
        return [Lane("pytest", args)]
    database = environ.get("TEST_DATABASE_NAME") or "test_oz0"
    prefix = environ.get("OZ0_CHANNEL_PREFIX") or "oz0"

    def apart(name: str, step: int, *, own_static: bool = False) -> dict[str, str]:
        env = {
            "TEST_DATABASE_NAME": f"{database}_{name}",
            "REDIS_URL": next_redis_database(environ["REDIS_URL"], step),
            "OZ0_CHANNEL_PREFIX": f"{prefix}-{name}",
        }
        if own_static:
            # These lanes run `./oz0 up` and stacks that collect static files: a test beside
            # them scanning the same folder would meet files the collection is replacing.
            env["OZ0_STATIC_ROOT"] = str(ROOT / ".oz0" / f"static-{name}")
        return env

    return [
        Lane("faults", ["-m", FAULTS_MARKERS, *args], apart("faults", 3, own_static=True)),
        Lane("slow", ["-m", SLOW_MARKERS, *args], apart("slow", 2, own_static=True)),
        Lane("live", ["-m", LIVE_MARKERS, *args], apart("live", 1)),
        Lane("rest", ["-m", REST_MARKERS, *parallel, *args], {"TEST_DATABASE_NAME": database}),
    ]


def combined_pytest_code(codes: list[int]) -> int:
    """One code for the lanes: the first failure's; 5 (nothing collected) only when every lane
    collected nothing, since a lane whose tests all live in the other one is no failure."""
    failures = [code for code in codes if code not in (0, NO_TESTS_COLLECTED)]
    if failures:
        return failures[0]
    return NO_TESTS_COLLECTED if codes and all(code == NO_TESTS_COLLECTED for code in codes) else 0


def combined_exit_code(failed: list[str], pytest_code: int) -> int:
    """pytest's own code, except that a failed check fails the whole (pytest's 0 or 5 become 1)."""
    if failed:
        return 1 if pytest_code in (0, NO_TESTS_COLLECTED) else pytest_code
    return pytest_code


def _copy_lines(source: IO[bytes], prefix: str, lock: threading.Lock) -> None:
    for line in iter(source.readline, b""):
        with lock:
            sys.stdout.write(prefix + line.decode(errors="replace"))
            sys.stdout.flush()


def _run_prefixed(argv: list[str], env: Mapping[str, str], prefix: str, lock: threading.Lock) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(argv, cwd=ROOT, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert process.stdout is not None
    _copy_lines(process.stdout, prefix, lock)
    return process


@dataclass(frozen=True)
class Spent:
    """What one lane or the checks took: seconds on the clock, and CPU seconds of its process and
    every process it waited for (pytest-xdist workers, the stacks and browsers its tests started)."""

    name: str
    wall: float
    cpu: float

    def line(self) -> str:
        return f"{self.name}: {_minutes(self.wall)} on the clock, {_minutes(self.cpu)} of CPU"


def _minutes(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 60}:{whole % 60:02d}"


def wait_spent(process: subprocess.Popen[bytes], name: str, started: float) -> tuple[int, Spent]:
    """Wait for a child as `Popen.wait` would, and read its resource use as only `wait4` can."""
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, Spent(name, time.monotonic() - started, usage.ru_utime + usage.ru_stime)


@dataclass(frozen=True)
class MachineTime:
    """The whole machine's CPU seconds, busy and idle, since it started (Linux's /proc/stat).

    The lanes' own figures leave out what no lane waited for: the database's and Redis's servers,
    and the harness processes bubblewrap starts (its init reaps them in their namespace, so their
    use never reaches the lane's `wait4`). The machine's figure over the run says how much of it
    was spent at all, and whether the run had cores to spare."""

    busy: float
    idle: float

    @classmethod
    def now(cls, path: str = "/proc/stat") -> MachineTime | None:
        try:
            with open(path) as stat:
                fields = stat.readline().split()
        except OSError:
            return None
        if not fields or fields[0] != "cpu":
            return None
        # user nice system idle iowait irq softirq steal (guest time is inside user already)
        ticks = [int(value) for value in fields[1:9]]
        ticks += [0] * (8 - len(ticks))  # older kernels print fewer columns
        per_second = os.sysconf("SC_CLK_TCK")
        idle = ticks[3] + ticks[4]
        return cls((sum(ticks[:8]) - idle) / per_second, idle / per_second)

    def line_since(self, start: MachineTime, wall: float) -> str:
        busy, idle = self.busy - start.busy, self.idle - start.idle
        share = busy / (busy + idle) if busy + idle > 0 else 0.0
        return (
            f"the machine: {_minutes(busy)} of CPU busy, {_minutes(idle)} idle, over {_minutes(wall)} on the clock "
            f"({share:.0%} of its {os.cpu_count() or 1} cores; the lanes' figures leave out the database, Redis "
            f"and sandboxed harness processes)"
        )


def run_checks(python: str, prefix: str, lock: threading.Lock, failed: list[str], spent: list[Spent] | None = None) -> None:
    """The static checks one after another (each reads the whole tree; two at once would only
    share the same cores), their lines prefixed; the names of those that failed go in `failed`."""
    started = time.monotonic()
    cpu = 0.0
    for name, argv in check_commands(python):
        with lock:
            sys.stdout.write(f"{prefix}oz0: {name}\n")
        code, used = wait_spent(_run_prefixed(argv, os.environ, prefix, lock), name, started)
        cpu += used.cpu
        if code != 0:
            failed.append(name)
    if spent is not None:
        spent.append(Spent("checks", time.monotonic() - started, cpu))


def bytecode_cache_is_cold(environ: Mapping[str, str]) -> bool:
    """Whether the test processes' bytecode cache (PYTHONPYCACHEPREFIX, `use_bytecode_cache`)
    holds nothing of this tree yet: a fresh clone, or a cache deleted. Judged by the rewritten
    tests/conftest.py that every pytest process imports."""
    prefix = environ.get("PYTHONPYCACHEPREFIX")
    if not prefix:
        return False
    return not any(Path(prefix, *ROOT.parts[1:], "tests").glob("conftest.*-pytest-*.pyc"))


def shares_compiling(lanes: list[Lane]) -> bool:
    """Whether several pytest processes would compile the same modules: the whole suite's lanes,
    or one lane over xdist workers (`--quick`). A person's own selection runs in one process,
    which compiles only what it imports; a collection of everything first would cost it more."""
    return len(lanes) > 1 or any("-n" in lane.args for lane in lanes)


def compile_once(python: str) -> Spent:
    """Compile, once, what the lanes' processes import, into the cold bytecode cache: a collection
    of the whole suite imports Django, oz0, every test module (pytest rewrites their asserts) and
    the libraries they use. Without it the lanes' first processes (four xdist workers, three
    engine lanes) each compiled the same thousands of modules at once: a collection took 27 s of
    CPU with the cache cold and 12 s warm. Its failures are the lanes' to report. It leaves the
    thorough tests out (QUICK_MARKERS): collecting the OpenAPI fuzz module builds its schemathesis
    tests (about 6 s of CPU) and compiles one file, which the rest lane's workers build anyway."""
    say("compiling what the tests import, once: the bytecode cache is cold")
    started = time.monotonic()
    process = subprocess.Popen(
        [python, "-m", "pytest", "--collect-only", "-q", "-m", QUICK_MARKERS],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return wait_spent(process, "compiling", started)[1]


def run_lanes(python: str, lanes: list[Lane], *, checks: bool = False) -> tuple[list[int], list[str]]:
    """Run the lanes at once, and the static checks beside them when asked; with more than one
    of these, each line of output carries its lane's name, and at the end a line each says what
    it took (on the clock and in CPU: on a machine of few cores the lanes share them, and the
    CPU says which lane to make cheaper). Returns the lanes' pytest codes and the names of the
    checks that failed."""
    failed: list[str] = []
    if len(lanes) == 1 and not checks:
        lane = lanes[0]
        return [subprocess.run([python, "-m", "pytest", *lane.args], cwd=ROOT, env={**os.environ, **lane.env}).returncode], failed
    lock = threading.Lock()
    width = max(len(name) for name in [lane.name for lane in lanes] + (["checks"] if checks else []))
    spent: list[Spent] = []
    codes: dict[str, int] = {}
    started = time.monotonic()
    machine_at_start = MachineTime.now()

    def follow(lane: Lane, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        _copy_lines(process.stdout, f"[{lane.name:<{width}}] ", lock)
        codes[lane.name], used = wait_spent(process, lane.name, started)
        spent.append(used)

    threads: list[threading.Thread] = []
    if checks:
        # The checks read sources, not bytecode: they start beside the compiling below.
        checker = threading.Thread(target=run_checks, args=(python, f"[{'checks':<{width}}] ", lock, failed, spent), daemon=True)
        checker.start()
        threads.append(checker)
    if shares_compiling(lanes) and bytecode_cache_is_cold(os.environ):
        spent.append(compile_once(python))
    for lane in lanes:
        process = subprocess.Popen(
            [python, "-m", "pytest", *lane.args],
            cwd=ROOT,
            env={**os.environ, **lane.env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        follower = threading.Thread(target=follow, args=(lane, process), daemon=True)
        follower.start()
        threads.append(follower)
    for thread in threads:
        thread.join()
    for used in sorted(spent, key=lambda used: used.wall):
        say(used.line())
    machine_at_end = MachineTime.now()
    if machine_at_start is not None and machine_at_end is not None:
        say(machine_at_end.line_since(machine_at_start, time.monotonic() - started))
    return [codes[lane.name] for lane in lanes], failed


def cmd_test(args: list[str]) -> int:
    quick = "--quick" in args
    args = [arg for arg in args if arg != "--quick"]
    os.environ.setdefault("OZ0_TEST_TOOLS", "1")
    use_base_environment(debug=True)
    use_bytecode_cache(os.environ)
    python = sys.executable
    with services():
        lanes = plan_lanes(args, quick=quick, environ=os.environ)
        for lane in lanes:
            say(f"pytest ({lane.name}) " + " ".join(lane.args))
        codes, failed = run_lanes(python, lanes, checks=checks_wanted(os.environ))
        code = combined_pytest_code(codes)
        if failed:
            say("failed: " + ", ".join(failed) + (f"; pytest exited {code}" if code else ""))
        return combined_exit_code(failed, code)
