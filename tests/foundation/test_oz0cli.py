"""oz0cli's decisions, imported and called directly: the subprocess tests (test_cli, test_up)
prove the launcher end to end; these pin each choice it makes without starting anything."""

from __future__ import annotations

import ast
import hashlib
import itertools
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oz0cli import ROOT, Fatal, checks, exit_code
from oz0cli.checks import (
    FAULTS_MARKERS,
    LIVE_MARKERS,
    QUICK_MARKERS,
    REST_MARKERS,
    SLOW_MARKERS,
    check_commands,
    checks_wanted,
    combined_exit_code,
    combined_pytest_code,
    next_redis_database,
    plan_lanes,
    run_lanes,
    selects_tests,
    xdist_workers,
)
from oz0cli.children import child_argv
from oz0cli.embedded import EmbeddedRedis, Ownership, free_port, redis_pings
from oz0cli.environment import (
    base_environment,
    listen_address,
    plain_http_environment,
    up_environment,
    use_bytecode_cache,
)
from oz0cli.main import USAGE, dispatch
from oz0cli.services import services_to_embed
from oz0cli.venv import install_command, requirements_digest, uv_pin, venv_is_current


@pytest.fixture
def environ(tmp_path: Path) -> Iterator[None]:
    """os.environ as it was after the test (dispatch adds the base environment to it), data under tmp_path."""
    saved = dict(os.environ)
    os.environ["OZ0_DATA_DIR"] = str(tmp_path)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


# ---------------------------------------------------------------- arguments and exit codes


def test_help_prints_the_usage_and_no_command_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert dispatch(["--help"]) == 0
    assert dispatch(["help"]) == 0
    assert dispatch([]) == 2
    assert capsys.readouterr().out == (USAGE + "\n") * 3


def test_an_unknown_command_is_one_line_then_the_usage(environ: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert dispatch(["token", "frobnicate", "x"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[0] == "oz0: unknown command 'token frobnicate'"
    assert USAGE in err


def test_each_command_names_its_child() -> None:
    python = "/venv/python"
    assert child_argv(python, "bench", ["--quick"]) == [python, "-m", "bench", "--quick"]
    assert child_argv(python, "manage", ["migrate"]) == [python, "manage.py", "migrate"]
    assert child_argv(python, "runner", ["--once"]) == [python, "manage.py", "runner", "--once"]
    assert child_argv(python, "token", ["create", "ann", "--workspace", "w"]) == [
        python, "manage.py", "token_create", "ann", "--workspace", "w",
    ]  # fmt: skip
    assert child_argv(python, "token", ["list", "ann"]) == [python, "manage.py", "token_list", "ann"]
    assert child_argv(python, "token", ["revoke", "3"]) == [python, "manage.py", "token_revoke", "3"]
    assert child_argv(python, "plugin", ["lint", "a.yaml"]) == [python, "manage.py", "plugin_lint", "a.yaml"]
    assert child_argv(python, "job", ["search", "q"]) == [python, "manage.py", "job_search", "q"]
    assert child_argv(python, "insights", ["agent", "triage"]) == [python, "manage.py", "insights_agent", "triage"]
    assert child_argv(python, "eval", ["run", "triage", "--version", "2", "--wait"]) == [
        python, "manage.py", "eval_run", "triage", "--version", "2", "--wait",
    ]  # fmt: skip
    assert child_argv(python, "token", []) is None
    assert child_argv(python, "frobnicate", []) is None


def test_a_fatal_is_one_line_and_2_a_ctrl_c_130(capsys: pytest.CaptureFixture[str]) -> None:
    def fatal() -> int:
        raise Fatal("OZ0_PORT must be a port number, not 'x'")

    def interrupted() -> int:
        raise KeyboardInterrupt

    assert exit_code(lambda: 7) == 7
    assert exit_code(fatal) == 2
    assert capsys.readouterr().err == "oz0: OZ0_PORT must be a port number, not 'x'\n"
    assert exit_code(interrupted) == 130


def test_a_failed_check_fails_the_test_command_without_hiding_pytests_code() -> None:
    assert combined_exit_code([], 0) == 0
    assert combined_exit_code([], 1) == 1
    assert combined_exit_code([], 5) == 5  # no tests collected: .ci/run decides what that means
    assert combined_exit_code(["mypy"], 0) == 1
    assert combined_exit_code(["ruff check", "mypy"], 5) == 1
    assert combined_exit_code(["mypy"], 2) == 2


def test_the_whole_suite_runs_as_four_lanes_apart_in_postgresql_and_redis() -> None:
    environ = {"TEST_DATABASE_NAME": "test_oz0_ci", "REDIS_URL": "redis://127.0.0.1:6379/0", "OZ0_TEST_WORKERS": "3"}
    faults, slow, live, rest = plan_lanes(["-q"], quick=False, environ=environ)
    assert faults.args == ["-m", FAULTS_MARKERS, "-q"] and slow.args == ["-m", SLOW_MARKERS, "-q"]
    assert live.args == ["-m", LIVE_MARKERS, "-q"]
    assert rest.args == ["-m", REST_MARKERS, "-n", "3", "--dist", "worksteal", "-q"]
    assert "thorough" not in REST_MARKERS and "thorough" in QUICK_MARKERS  # --quick alone leaves them out
    assert faults.env == {
        "TEST_DATABASE_NAME": "test_oz0_ci_faults",
        "REDIS_URL": "redis://127.0.0.1:6379/3",
        "OZ0_CHANNEL_PREFIX": "oz0-faults",
        "OZ0_STATIC_ROOT": str(ROOT / ".oz0" / "static-faults"),
    }
    assert slow.env == {
        "TEST_DATABASE_NAME": "test_oz0_ci_slow",
        "REDIS_URL": "redis://127.0.0.1:6379/2",
        "OZ0_CHANNEL_PREFIX": "oz0-slow",
        "OZ0_STATIC_ROOT": str(ROOT / ".oz0" / "static-slow"),
    }
    assert live.env == {
        "TEST_DATABASE_NAME": "test_oz0_ci_live",
        "REDIS_URL": "redis://127.0.0.1:6379/1",
        "OZ0_CHANNEL_PREFIX": "oz0-live",
    }
    assert rest.env == {"TEST_DATABASE_NAME": "test_oz0_ci"}
    (default,) = [lane for lane in plan_lanes([], quick=False, environ={"REDIS_URL": "redis://r/0"}) if lane.name == "rest"]
    assert default.env == {"TEST_DATABASE_NAME": "test_oz0"}


def test_the_rest_lane_has_two_workers_per_core_within_bounds_unless_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    for cores, workers in ((1, 2), (2, 4), (3, 6), (16, 6), (None, 2)):
        monkeypatch.setattr(os, "cpu_count", lambda cores=cores: cores)
        assert xdist_workers({}) == workers, cores
    assert xdist_workers({"OZ0_TEST_WORKERS": "1"}) == 1
    assert xdist_workers({"OZ0_TEST_WORKERS": "0"}) == xdist_workers({"OZ0_TEST_WORKERS": "many"}) == xdist_workers({})


def test_each_xdist_worker_after_the_first_takes_a_redis_database_and_prefix_beyond_the_lanes() -> None:
    from tests.parallel_workers import keep_workers_apart

    taken = {"redis://h:6379/0", "redis://h:6379/1", "redis://h:6379/2", "redis://h:6379/3"}  # rest, live, slow, faults
    seen = set()
    for worker in ("gw0", "gw1", "gw2", "gw3"):
        environ = {"PYTEST_XDIST_WORKER": worker, "REDIS_URL": "redis://h:6379/0"}
        keep_workers_apart(environ)
        if worker == "gw0":
            assert environ == {"PYTEST_XDIST_WORKER": "gw0", "REDIS_URL": "redis://h:6379/0"}
            continue
        assert environ["REDIS_URL"] not in taken | seen and environ["OZ0_CHANNEL_PREFIX"] == f"oz0-{worker}"
        seen.add(environ["REDIS_URL"])
    outside = {"REDIS_URL": "redis://h:6379/0"}
    keep_workers_apart(outside)
    assert outside == {"REDIS_URL": "redis://h:6379/0"}


def test_the_checks_run_beside_the_lanes_and_their_failures_are_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    python = sys.executable
    monkeypatch.setattr(
        checks,
        "check_commands",
        lambda python: [
            ("refuses", [python, "-c", "print('bad line'); raise SystemExit(3)"]),
            ("agrees", [python, "-c", "print('fine')"]),
        ],
    )
    lane = checks.Lane("unit", ["--version"])
    codes, failed = run_lanes(python, [lane], checks=True)
    assert codes == [0] and failed == ["refuses"]
    output = capsys.readouterr()
    printed = output.out.splitlines()
    assert "[checks] bad line" in printed and "[checks] fine" in printed and "[checks] oz0: refuses" in printed
    # At the end, what each took, on the clock and in CPU (the CPU of the processes it waited for too).
    summary = [line for line in output.err.splitlines() if "on the clock, " in line]
    assert {line.split(": ")[1] for line in summary} == {"unit", "checks"}
    assert all(re.fullmatch(r"oz0: \w+: \d+:\d\d on the clock, \d+:\d\d of CPU", line) for line in summary)
    # And the whole machine's CPU over the run, which counts what no lane waited for.
    assert [line for line in output.err.splitlines() if line.startswith("oz0: the machine: ")]
    assert combined_exit_code(failed, combined_pytest_code(codes)) == 1


def test_a_cold_bytecode_cache_is_judged_by_where_pytest_writes_the_rewritten_conftest(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    prefix = tmp_path / "pycache"
    assert not checks.bytecode_cache_is_cold({}), "no prefix: the processes keep bytecode where Python does"
    assert checks.bytecode_cache_is_cold({"PYTHONPYCACHEPREFIX": str(prefix)})
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(prefix)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "tests/foundation/test_cli.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert collected.returncode == 0, collected.stdout[-2000:]
    assert not checks.bytecode_cache_is_cold({"PYTHONPYCACHEPREFIX": str(prefix)})


@pytest.mark.parametrize("cold", [True, False])
def test_the_lanes_start_after_one_compiling_only_when_the_cache_is_cold(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], cold: bool
) -> None:
    started: list[str] = []
    monkeypatch.setattr(checks, "bytecode_cache_is_cold", lambda environ: cold)
    monkeypatch.setattr(checks, "compile_once", lambda python: started.append("compiling") or checks.Spent("compiling", 0.0, 0.0))
    popen = subprocess.Popen

    def lane_started(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        started.append("lane")
        return popen(argv, **kwargs)

    monkeypatch.setattr(checks.subprocess, "Popen", lane_started)
    codes, _ = run_lanes(sys.executable, [checks.Lane("a", ["--version"]), checks.Lane("b", ["--version"])])
    assert codes == [0, 0]
    assert started == (["compiling", "lane", "lane"] if cold else ["lane", "lane"])


def test_only_lanes_of_several_processes_compile_first() -> None:
    environ = {"REDIS_URL": "redis://127.0.0.1:6379/0"}
    assert checks.shares_compiling(plan_lanes([], quick=False, environ=environ))
    assert checks.shares_compiling(plan_lanes([], quick=True, environ=environ))
    # A person's own selection: one process, which compiles only what it imports.
    assert not checks.shares_compiling(plan_lanes(["tests/runs/test_cancel.py"], quick=False, environ=environ))
    assert not checks.shares_compiling(plan_lanes(["tests/runs", "-k", "cancel"], quick=True, environ=environ))


def test_a_lanes_cpu_counts_the_processes_it_waited_for() -> None:
    """A lane's CPU is its own and its children's (xdist workers, stacks): a child that spins for
    0.6 s of CPU shows in its parent's figure."""
    spin = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass"
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {spin!r}], check=True)"
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE)
    assert process.stdout is not None
    process.stdout.read()
    code, used = checks.wait_spent(process, "spinner", started)
    assert code == 0 and process.returncode == 0
    assert used.cpu >= 0.6 and used.wall >= 0.6
    assert used.line() == f"spinner: 0:{round(used.wall):02d} on the clock, 0:{round(used.cpu):02d} of CPU"


def test_the_machines_cpu_is_read_from_proc_stat_busy_apart_from_idle_and_waiting_on_disks(tmp_path: Path) -> None:
    hz = os.sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text(f"cpu  {3 * hz} {hz} {2 * hz} {10 * hz} {hz} 0 {hz} 0 0 0\ncpu0 1 2 3 4\n")
    start = checks.MachineTime.now(str(stat))
    assert start == checks.MachineTime(busy=7.0, idle=11.0)
    stat.write_text(f"cpu  {63 * hz} {hz} {62 * hz} {20 * hz} {hz} 0 {hz} 0 0 0\n")
    end = checks.MachineTime.now(str(stat))
    assert end is not None and end.busy - start.busy == 120.0 and end.idle - start.idle == 10.0
    line = end.line_since(start, wall=65.0)
    assert line.startswith("the machine: 2:00 of CPU busy, 0:10 idle, over 1:05 on the clock (92% of its ")
    # Fewer columns (an old kernel) count as zero; no /proc (not Linux) gives no figure.
    stat.write_text(f"cpu  {hz} 0 {hz} {hz}\n")
    assert checks.MachineTime.now(str(stat)) == checks.MachineTime(busy=2.0, idle=1.0)
    assert checks.MachineTime.now(str(tmp_path / "absent")) is None


@pytest.mark.parametrize(
    "markers",
    [set(chosen) for size in range(6) for chosen in itertools.combinations(("live", "browser", "slow", "faults", "spec"), size)],
)
def test_every_test_runs_in_exactly_one_lane(markers: set[str]) -> None:
    """The lanes' marker expressions, evaluated as pytest does, split every mix of markers once."""
    from _pytest.mark.expression import Expression

    lanes = plan_lanes([], quick=False, environ={"REDIS_URL": "redis://r/0"})
    chosen = [lane.name for lane in lanes if Expression.compile(lane.args[1]).evaluate(lambda name, **_: name in markers)]
    assert len(chosen) == 1, (markers, chosen)


def test_a_persons_own_selection_runs_as_given_and_quick_narrows_it() -> None:
    environ = {"REDIS_URL": "redis://127.0.0.1:6379/0"}
    for chosen in (["tests/runs"], ["-k", "cancel"], ["-m", "live"], ["-q", "tests/x.py::test_y"], ["--deselect=a"]):
        assert selects_tests(chosen), chosen
        (lane,) = plan_lanes(chosen, quick=False, environ=environ)
        assert lane.args == chosen and lane.env == {}
    for options in ([], ["-q"], ["--timeout", "600"], ["-x", "--tb", "short"], ["-p", "no:warnings"]):
        assert not selects_tests(options), options
    (quick,) = plan_lanes(["tests/runs"], quick=True, environ=environ)
    assert quick.args == ["-m", QUICK_MARKERS, "tests/runs"]
    (everything_quick,) = plan_lanes(["-q"], quick=True, environ={**environ, "OZ0_TEST_WORKERS": "2"})
    assert everything_quick.args == ["-m", QUICK_MARKERS, "-n", "2", "--dist", "worksteal", "-q"]


def test_a_lanes_redis_is_the_next_database_of_the_same_server() -> None:
    assert next_redis_database("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/1"
    assert next_redis_database("redis://:pw@host:6380/15") == "redis://:pw@host:6380/0"
    assert next_redis_database("redis://host:6379") == "redis://host:6379/1"
    assert next_redis_database("unix:///tmp/r.sock?db=3") == "unix:///tmp/r.sock?db=4"
    assert next_redis_database("unix:///tmp/r.sock") == "unix:///tmp/r.sock?db=1"
    assert next_redis_database("redis://127.0.0.1:6379/0", 2) == "redis://127.0.0.1:6379/2"


def test_the_lanes_fail_when_either_fails_and_are_empty_only_when_both_are() -> None:
    assert combined_pytest_code([0, 0]) == 0
    assert combined_pytest_code([0, 1]) == 1
    assert combined_pytest_code([2, 0]) == 2
    assert combined_pytest_code([5, 0]) == 0  # everything selected was in the other lane
    assert combined_pytest_code([5, 5]) == 5
    assert combined_pytest_code([5, 1]) == 1
    assert combined_pytest_code([3]) == 3


def test_oz0_skip_checks_turns_the_checks_off() -> None:
    assert checks_wanted({})
    assert checks_wanted({"OZ0_SKIP_CHECKS": "0"})
    for value in ("1", "true", "yes"):
        assert not checks_wanted({"OZ0_SKIP_CHECKS": value})
    names = [name for name, _ in check_commands("py")]
    assert names == ["ruff check", "ruff format --check", "makemigrations --check", "mypy"]


# ---------------------------------------------------------------- the environment children get


def test_the_base_environment_fills_only_what_the_person_left_unset(environ: None, tmp_path: Path) -> None:
    added = base_environment({}, debug=True)
    assert added["DJANGO_SETTINGS_MODULE"] == "oz0site.settings"
    assert added["PYTHONUNBUFFERED"] == "1" and added["DEBUG"] == "1"
    assert base_environment({}, debug=False)["DEBUG"] == "0"
    assert len(added["SECRET_KEY"]) >= 50
    assert (tmp_path / "secret_key").stat().st_mode & 0o777 == 0o600
    assert base_environment({}, debug=True)["SECRET_KEY"] == added["SECRET_KEY"]  # one key per install
    given = {"DJANGO_SETTINGS_MODULE": "x", "PYTHONUNBUFFERED": "", "DEBUG": "0", "SECRET_KEY": "mine"}
    assert base_environment(given, debug=True) == {}
    assert base_environment({**given, "SECRET_KEY": ""}, debug=True) == {"SECRET_KEY": added["SECRET_KEY"]}


def test_the_test_processes_keep_bytecode_outside_the_tree_even_where_writing_it_is_off(environ: None, tmp_path: Path) -> None:
    """Without .pyc files every process of the suite compiles Django and oz0 from source again."""
    told = {"PYTHONDONTWRITEBYTECODE": "1", "PATH": os.environ.get("PATH", "")}
    use_bytecode_cache(told)
    assert "PYTHONDONTWRITEBYTECODE" not in told
    assert told["PYTHONPYCACHEPREFIX"] == str(tmp_path / "pycache")
    chosen = {"PYTHONPYCACHEPREFIX": "/elsewhere"}
    use_bytecode_cache(chosen)
    assert chosen == {"PYTHONPYCACHEPREFIX": "/elsewhere"}
    source = tmp_path / "src"
    source.mkdir()
    (source / "compiled_once.py").write_text("VALUE = 1\n")
    import_it = f"import sys; sys.path.insert(0, {str(source)!r}); import compiled_once"
    assert subprocess.run([sys.executable, "-c", import_it], env=told, check=True).returncode == 0
    assert list((tmp_path / "pycache").rglob("compiled_once.*.pyc")), "no bytecode under the prefix"
    assert not (source / "__pycache__").exists(), "bytecode written beside the source"


def test_up_serves_plain_http_where_it_is_told() -> None:
    off = {"SECURE_SSL_REDIRECT": "0", "SESSION_COOKIE_SECURE": "0", "CSRF_COOKIE_SECURE": "0"}
    assert plain_http_environment({}) == off
    assert plain_http_environment({"SECURE_SSL_REDIRECT": "1"}) == {k: v for k, v in off.items() if k != "SECURE_SSL_REDIRECT"}
    assert listen_address({}) == ("127.0.0.1", 8000)
    assert listen_address({"OZ0_HOST": "0.0.0.0", "OZ0_PORT": "9001"}) == ("0.0.0.0", 9001)
    with pytest.raises(Fatal, match=r"^OZ0_PORT must be a port number, not 'eighty'$"):
        listen_address({"OZ0_PORT": "eighty"})
    assert up_environment(["--demo"], {}) == {"OZ0_TEST_TOOLS": "1"}


# ---------------------------------------------------------------- services: given or embedded


def test_only_unset_urls_get_an_embedded_service() -> None:
    given = {"DATABASE_URL": "postgres://x@h:1/d", "REDIS_URL": "redis://h:2/0"}
    assert services_to_embed(given) == []
    assert services_to_embed({}) == ["DATABASE_URL", "REDIS_URL"]
    assert services_to_embed({**given, "REDIS_URL": ""}) == ["REDIS_URL"]
    assert services_to_embed({"REDIS_URL": "redis://h:2/0"}) == ["DATABASE_URL"]


@pytest.fixture
def fake_redis() -> Iterator[int]:
    """A loopback port that answers PING with +PONG, as a running embedded Redis does."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.recv(16)
                conn.sendall(b"+PONG\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield int(server.getsockname()[1])
    stop.set()
    thread.join()
    server.close()


def test_a_running_embedded_redis_is_reused_and_adopted_when_its_starter_is_gone(tmp_path: Path, fake_redis: int) -> None:
    assert redis_pings(fake_redis) and not redis_pings(free_port())
    state = Ownership(tmp_path / "redis" / "server.json")
    (tmp_path / "redis").mkdir()
    state.path.write_text(f'{{"pid": {os.getpid()}, "port": {fake_redis}, "owner": 999999999}}')  # the owner died

    redis = EmbeddedRedis(tmp_path)
    assert redis.start() == f"redis://127.0.0.1:{fake_redis}/0"
    assert redis.owned and state.read()["owner"] == os.getpid()


def test_a_running_embedded_redis_with_a_live_owner_is_only_shared(tmp_path: Path, fake_redis: int) -> None:
    (tmp_path / "redis").mkdir()
    state = Ownership(tmp_path / "redis" / "server.json")
    state.path.write_text(f'{{"pid": {os.getpid()}, "port": {fake_redis}, "owner": {os.getppid()}}}')

    redis = EmbeddedRedis(tmp_path)
    assert redis.start() == f"redis://127.0.0.1:{fake_redis}/0"
    assert not redis.owned
    redis.stop()  # not ours to stop: the record stays
    assert state.read()["owner"] == os.getppid()


def test_ownership_is_released_only_by_its_owner(tmp_path: Path) -> None:
    state = Ownership(tmp_path / "pg.json")
    assert state.read() == {} and not state.owner_alive()
    state.claim(port=5)
    assert state.read() == {"port": 5, "owner": os.getpid()}
    assert not state.owner_alive()  # we are the owner: nobody else holds it
    state.release()
    assert not state.path.exists()
    state.path.write_text("not json")
    assert state.read() == {}


# ---------------------------------------------------------------- the virtual environment


def test_the_venv_is_installed_with_its_bytecode_compiled() -> None:
    """pip compiles at install; uv only when told. A sandboxed bridge reads the venv read-only."""
    assert "--compile-bytecode" in install_command("/bin/uv")
    assert "--no-compile" not in install_command(None)


def test_the_venv_is_reinstalled_whenever_requirements_change(tmp_path: Path) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("django==5.2\nuv==0.9.1\n")
    digest = requirements_digest(requirements)
    assert digest == hashlib.sha256(requirements.read_bytes()).hexdigest()
    python, stamp = tmp_path / "python", tmp_path / "stamp"
    assert not venv_is_current(digest, python=python, stamp=stamp)  # no venv yet
    python.touch()
    assert not venv_is_current(digest, python=python, stamp=stamp)  # never installed
    stamp.write_text(digest + "\n")
    assert venv_is_current(digest, python=python, stamp=stamp)
    requirements.write_text("django==5.2.1\nuv==0.9.1\n")
    assert not venv_is_current(requirements_digest(requirements), python=python, stamp=stamp)
    assert uv_pin(requirements.read_text()) == "uv==0.9.1"
    assert uv_pin("django\n") == "uv"


def imported_modules(nodes: list[ast.stmt]) -> set[str]:
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add(node.module or "")
    return found


@pytest.mark.parametrize("path", ["oz0", "oz0cli/__init__.py", "oz0cli/venv.py"])
def test_what_the_machines_python_runs_imports_the_standard_library_only(path: str) -> None:
    """The launcher runs these before .venv exists: a third-party import would break a fresh checkout.
    (The launcher imports oz0cli.main inside the venv only, so its module level is what counts.)"""
    tree = ast.parse((ROOT / path).read_text())
    nodes = tree.body if path == "oz0" else list(ast.walk(tree))
    modules = imported_modules([node for node in nodes if isinstance(node, ast.stmt)])
    outside = {name for name in modules if name.split(".")[0] not in sys.stdlib_module_names}
    assert outside <= {"oz0cli", "oz0cli.venv"}


SUPERVISED = """
import contextlib, os, signal, sys
from oz0cli.supervisor import Supervisor
supervisor = Supervisor({})
supervisor.start("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"])
# The signal lands while this thread is inside the stop flag's own code (a threading.Event's lock
# held, as in Event.wait or an earlier handler's Event.set).
with getattr(supervisor.stopping, "_cond", contextlib.nullcontext()):
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)
sys.exit(supervisor.wait())
"""


def test_a_signal_that_lands_mid_wait_still_stops_the_supervisor_and_its_children() -> None:
    """`up` once hung on SIGTERM: its handler set a threading.Event whose lock the interrupted main
    thread held, and waited on itself forever. The handler takes no lock now."""
    _, out = run_supervised(SUPERVISED, hung="the supervisor hung on a signal")
    assert "stopping sleeper" in out and "stopped" in out


def run_supervised(script: str, *, hung: str) -> tuple[int, str]:
    """A supervisor script's exit code and output; `hung` fails the test when it runs past 30 s."""
    process = subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        out, _ = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError(hung) from None
    return process.returncode, out


STUBBORN = """
import os, signal, sys, tempfile, time
from pathlib import Path
from typing import Any
from oz0cli.supervisor import Supervisor
supervisor = Supervisor({})
supervisor.stop_graces = ((0.5, signal.SIGQUIT), (0.5, signal.SIGKILL))
ready = Path(tempfile.mkdtemp()) / "deaf"
deaf = (
    "import signal, sys, time, pathlib; [signal.signal(s, signal.SIG_IGN) for s in (signal.SIGTERM, signal.SIGQUIT)]; "
    f"pathlib.Path({str(ready)!r}).touch(); time.sleep(600)"
)
supervisor.start("stubborn", [sys.executable, "-c", deaf])
supervisor.start("polite", [sys.executable, "-c", "import time; time.sleep(600)"])
deadline = time.monotonic() + 20
while not ready.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
print("deaf" if ready.exists() else "never ready", flush=True)
os.kill(os.getpid(), signal.SIGTERM)
sys.exit(supervisor.wait())
"""


def test_a_child_deaf_to_the_stop_is_named_at_each_harder_signal_and_killed() -> None:
    """`up`'s stop says who is still running when it escalates, and how long the whole stop took,
    so a slow stop reads apart from a hung one."""
    code, out = run_supervised(STUBBORN, hung="the supervisor did not stop a child deaf to SIGTERM and SIGQUIT")
    assert code == 0, out
    assert "deaf" in out, out
    escalations = [line.split("| ", 1)[1] for line in out.splitlines() if "still running after" in line]
    assert [line.split(": ", 1)[1] for line in escalations] == ["stubborn; sending SIGQUIT", "stubborn; sending SIGKILL"], out
    assert re.search(r"stopped in \d+\.\ds", out), out


def test_a_quick_run_leaves_the_thorough_only_modules_uncollected() -> None:
    from oz0cli.checks import QUICK_MARKERS, REST_MARKERS
    from tests.conftest import leaves_out_thorough

    assert leaves_out_thorough(QUICK_MARKERS)
    assert not leaves_out_thorough(REST_MARKERS)
    assert not leaves_out_thorough("") and not leaves_out_thorough("thorough") and not leaves_out_thorough("not live")


def test_the_engine_lanes_skip_modules_that_name_no_engine_marker(tmp_path: Path) -> None:
    """The live, slow and fault lanes import only modules whose text names an engine marker (the
    rest lane, which collects every module, checks each marked test's module names it)."""
    from tests.conftest import names_an_engine_marker, needs_an_engine_marker

    lanes = {lane.name: lane.args[1] for lane in plan_lanes([], quick=False, environ={"REDIS_URL": "redis://r/0"})}
    assert {name for name, expression in lanes.items() if needs_an_engine_marker(expression)} == {"faults", "slow", "live"}
    assert not needs_an_engine_marker(QUICK_MARKERS) and not needs_an_engine_marker("")
    assert needs_an_engine_marker("live") and not needs_an_engine_marker("live or spec")
    marked = tmp_path / "test_marked.py"
    marked.write_text("import pytest\npytestmark = [pytest.mark.faults, pytest.mark.slow]\n")
    unmarked = tmp_path / "test_unmarked.py"
    unmarked.write_text("import pytest\n# a lively test, slowly\n@pytest.mark.spec('S1')\ndef test_x(): pass\n")
    assert names_an_engine_marker(marked) and not names_an_engine_marker(unmarked)


def test_the_tests_that_use_the_sessions_one_browser_run_after_every_other_in_their_order() -> None:
    """The browser leaves an event loop marked running in its thread, which `async_to_sync`
    refuses: a test after it that calls async code from sync would fail (tests/browser.py)."""
    from types import SimpleNamespace

    from tests.conftest import browsers_last

    items: list[Any] = [
        SimpleNamespace(name="page a", fixturenames=["browsers", "chromium", "console_server"]),
        SimpleNamespace(name="plain 1", fixturenames=["db"]),
        SimpleNamespace(name="sso", fixturenames=["chromium", "sso_site"]),
        SimpleNamespace(name="plain 2", fixturenames=["live"]),
        SimpleNamespace(name="page b", fixturenames=["browsers", "chromium"]),
        SimpleNamespace(name="plain 3"),
    ]
    browsers_last(items)
    assert [item.name for item in items] == ["plain 1", "plain 2", "plain 3", "page a", "sso", "page b"]
