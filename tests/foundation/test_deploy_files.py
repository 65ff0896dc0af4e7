"""deploy/ (the image, the compose file, the Helm chart) runs what `./oz0 up` runs, with settings oz0 reads.

A deployment file that sets a variable oz0 never reads is a setting someone believes in and
nothing honours; a container whose command line drifted from `up`'s runs another oz0. Both are
checked here against the code itself: the names every module reads from its environment, and
the command lines `up` starts (recorded through a stand-in supervisor)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from oz0cli import ROOT, Fatal, processes, up

DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "oz0"
# What the interpreter and Django themselves read (the image sets them).
PROCESS_NAMES = {"DJANGO_SETTINGS_MODULE", "PYTHONUNBUFFERED"}
READ = re.compile(r"""(?:env(?:\.\w+)?\(|environ(?:\.get|\.setdefault)?\(|environ\[|getenv\()\s*["']([A-Z][A-Z0-9_]+)["']""")


def names_oz0_reads() -> set[str]:
    """Every variable a module of oz0 reads from its environment (settings and the command line)."""
    names = set(PROCESS_NAMES)
    for folder in ("oz0site", "oz0cli", "runs", "notify", "insights", "inbox", "console", "tenancy", "oz0agents"):
        for path in (ROOT / folder).rglob("*.py"):
            names |= set(READ.findall(path.read_text()))
    return names


def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def oz0_services() -> dict[str, dict[str, Any]]:
    return {name: service for name, service in compose()["services"].items() if service.get("image") == "oz0:local"}


def env_file_names(path: Path) -> set[str]:
    return {line.split("=", 1)[0] for line in path.read_text().splitlines() if line and not line.startswith("#")}


def test_the_reader_of_names_finds_what_settings_reads() -> None:
    """The scan is what the checks below rest on: it must see the settings' own reads."""
    read = names_oz0_reads()
    assert {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DB_PGBOUNCER", "OZ0_PORT", "OZ0_DATA_DIR", "CELERY_LOG_LEVEL"} <= read
    assert "OZ0_NOT_A_SETTING" not in read


def test_every_variable_the_compose_file_sets_is_one_oz0_reads() -> None:
    read = names_oz0_reads()
    set_here: set[str] = env_file_names(DEPLOY / "oz0.env.example")
    for service in oz0_services().values():
        set_here |= set(service.get("environment") or {})
    docker_env = re.findall(r"^\s+([A-Z][A-Z0-9_]+)=", (DEPLOY / "Dockerfile").read_text(), re.M)
    set_here |= set(docker_env)
    assert len(set_here) > 10
    assert sorted(set_here - read) == []


def test_every_variable_the_chart_sets_is_one_oz0_reads() -> None:
    read = names_oz0_reads()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    set_here = set(values["settings"])
    for template in (CHART / "templates").iterdir():
        set_here |= set(re.findall(r"- name: ([A-Z][A-Z0-9_]+)", template.read_text()))
    assert {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DB_PGBOUNCER"} <= set_here
    assert sorted(set_here - read) == []


ONE_OFFS = {"db-roles": ["manage", "db_roles"], "migrate": ["manage", "migrate", "--noinput"]}


def test_every_oz0_container_runs_a_role_of_serve_or_the_migration() -> None:
    services = oz0_services()
    commands = {name: service["command"] for name, service in services.items()}
    roles = {command[1] for command in commands.values() if command[0] == "serve"}
    assert roles == set(processes.ROLES)
    for name, command in commands.items():
        assert command in (ONE_OFFS["migrate"], ONE_OFFS["db-roles"], *(["serve", role] for role in processes.ROLES)), name
    assert {name: services[name]["command"] for name in ONE_OFFS} == ONE_OFFS
    # Least privilege: the administrator makes the roles, the owner migrates, the app runs.
    assert services["db-roles"]["environment"]["DATABASE_URL"].startswith("postgres://postgres:")
    assert services["migrate"]["environment"]["DATABASE_URL"].startswith("postgres://oz0_owner:")
    assert services["migrate"]["environment"]["DATABASE_URL"].split("@")[1].startswith("postgres:5432")
    for name, service in services.items():  # the processes go through PgBouncer as the app role
        if name not in ONE_OFFS:
            url = service["environment"]["DATABASE_URL"]
            assert (
                url.startswith("postgres://oz0_app:")
                and "@pgbouncer:6432/" in url
                and service["environment"]["DB_PGBOUNCER"] == "1"
            )
    two_web = [name for name, command in commands.items() if command == ["serve", "web"]]
    assert len(two_web) == 2 and services["worker"]["deploy"]["replicas"] == 2
    assert compose()["services"]["pgbouncer"]["environment"]["POOL_MODE"] == "transaction"


def test_the_chart_runs_each_role_with_serve_and_scales_workers_on_ready_tasks() -> None:
    deployments = (CHART / "templates" / "processes.yaml").read_text()
    listed = re.search(r"range \$role := list ((?:\"\w+\" ?)+)", deployments)
    assert listed is not None and re.findall(r"\"(\w+)\"", listed.group(1)) == list(processes.ROLES)
    assert 'args: ["serve", "{{ $role }}"]' in deployments
    scaling = (CHART / "templates" / "worker-scaling.yaml").read_text()
    metric = re.search(r"query: sum\((\w+)\{queue=\"(\w+)\"\}\)", scaling)
    assert metric is not None and metric.group(2) == "oz0"
    assert f'"{metric.group(1)}"' in (ROOT / "oz0site" / "metrics.py").read_text()  # a metric /metrics renders
    assert "type: cpu" in scaling  # the fallback trigger
    assert "runAsNonRoot: true" in (CHART / "templates" / "_helpers.tpl").read_text()


def test_the_image_is_multi_stage_and_never_root() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert len(re.findall(r"^FROM ", dockerfile, re.M)) == 2
    user = re.findall(r"^USER (\S+)", dockerfile, re.M)
    assert user and not user[-1].startswith(("0", "root"))
    assert 'ENTRYPOINT ["./oz0"]' in dockerfile
    assert ".venv" in (ROOT / ".dockerignore").read_text().split()


class RecordingSupervisor:
    started: dict[str, list[str]] = {}
    inherited: dict[str, tuple[int, ...]] = {}

    lines: list[str] = []

    def __init__(self, env: dict[str, str]) -> None:
        self.stopping = type("Never", (), {"is_set": staticmethod(lambda: False)})()
        RecordingSupervisor.started = {}
        RecordingSupervisor.inherited = {}
        RecordingSupervisor.lines = []

    def watch(self, service: Any) -> None: ...

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None, pass_fds: tuple[int, ...] = ()) -> None:
        RecordingSupervisor.started[name] = argv
        RecordingSupervisor.inherited[name] = pass_fds

    def line(self, name: str, text: str) -> None:
        RecordingSupervisor.lines.append(text)

    def stop(self) -> None: ...

    def wait(self) -> int:
        return 0


@contextmanager
def no_services() -> Iterator[list[Any]]:
    yield []


def test_up_starts_exactly_the_command_lines_serve_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every role as `serve` runs it; the web role as several processes on `up`'s one listening
    socket (OZ0_WEB_PROCESSES), each the command `serve web` runs but for where it listens."""
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    monkeypatch.setattr(up, "Supervisor", RecordingSupervisor)
    monkeypatch.setattr(up, "services", no_services)
    monkeypatch.setattr(up, "call_command", lambda *args, **kwargs: None)
    monkeypatch.setattr(up.processes, "web_socket", lambda host, port: listening)
    monkeypatch.setattr(up, "wait_for_web", lambda *args, **kwargs: True)
    monkeypatch.setattr(up, "data_dir", lambda: tmp_path)
    monkeypatch.setattr(up.django, "setup", lambda: None)
    for name in ("OZ0_HOST", "OZ0_PORT", "OZ0_QUEUE", "CELERY_LOG_LEVEL", "OZ0_TEST_TOOLS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OZ0_WEB_PROCESSES", "3")

    def serves(role: str, **where: Any) -> list[str]:
        return processes.command(
            role,
            python=sys.executable,
            host="127.0.0.1",
            port=8000,
            schedule=tmp_path / "celerybeat-schedule",
            environ=os.environ,
            **where,
        )

    on_the_socket, shared = serves("web", listening=listening), listening.fileno()
    assert on_the_socket[on_the_socket.index("--fd") + 1] == str(shared)
    assert up.cmd_up([]) == 0
    assert listening.fileno() == -1, "up left its listening socket open"
    started = RecordingSupervisor.started
    assert list(started) == ["web-1", "web-2", "web-3", *processes.ROLES[1:]]
    for role in processes.ROLES[1:]:
        assert started[role] == serves(role)
        assert RecordingSupervisor.inherited[role] == ()
    for web in ("web-1", "web-2", "web-3"):
        assert started[web] == on_the_socket
        assert RecordingSupervisor.inherited[web] == (shared,)
    alone = serves("web")
    # The same program and application as `serve web`; only the listening endpoint differs.
    assert [a for a in on_the_socket if a not in ("--fd", str(shared))] == [
        a for a in alone if a not in ("-b", "127.0.0.1", "-p", "8000")
    ]
    assert started["worker"][started["worker"].index("-O") + 1] == "fair"
    assert started["sessions"][started["sessions"].index("-P") + 1] == "threads"


def test_up_on_an_ipv6_address_runs_one_web_process_that_listens_by_itself(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """daphne would adopt an inherited IPv6 socket as IPv4 and garble its peers' addresses."""
    bound: list[socket.socket] = []

    def ipv6_socket(host: str, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET6)
        sock.bind(("::1", 0))
        bound.append(sock)
        return sock

    monkeypatch.setattr(up, "Supervisor", RecordingSupervisor)
    monkeypatch.setattr(up, "services", no_services)
    monkeypatch.setattr(up, "call_command", lambda *args, **kwargs: None)
    monkeypatch.setattr(up.processes, "web_socket", ipv6_socket)
    monkeypatch.setattr(up, "wait_for_web", lambda *args, **kwargs: True)
    monkeypatch.setattr(up, "data_dir", lambda: tmp_path)
    monkeypatch.setattr(up.django, "setup", lambda: None)
    for name in ("OZ0_QUEUE", "CELERY_LOG_LEVEL", "OZ0_TEST_TOOLS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OZ0_HOST", "::1")
    monkeypatch.setenv("OZ0_PORT", "8001")
    monkeypatch.setenv("OZ0_WEB_PROCESSES", "3")
    assert up.cmd_up([]) == 0
    assert bound[0].fileno() == -1, "the IPv6 socket must be given up before daphne binds the address"
    started = RecordingSupervisor.started
    assert list(started) == ["web", *processes.ROLES[1:]]
    assert started["web"][-5:] == ["-b", "::1", "-p", "8001", "oz0site.asgi:application"]
    assert RecordingSupervisor.inherited["web"] == ()


def test_up_says_it_still_waits_for_a_slow_web_process_and_prints_the_address_once_it_answers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On a machine whose cores are all busy the web process may take minutes to answer: `up` never
    gives up on it silently (the address would then never be printed)."""
    answers = iter([False, False, True])
    patience: list[float] = []

    def slow_web(host: str, port: int, supervisor: Any, timeout: float) -> bool:
        patience.append(timeout)
        return next(answers)

    monkeypatch.setattr(up, "Supervisor", RecordingSupervisor)
    monkeypatch.setattr(up, "services", no_services)
    monkeypatch.setattr(up, "call_command", lambda *args, **kwargs: None)
    monkeypatch.setattr(up.processes, "web_socket", lambda host, port: None)
    monkeypatch.setattr(up, "wait_for_web", slow_web)
    monkeypatch.setattr(up, "data_dir", lambda: tmp_path)
    monkeypatch.setattr(up.django, "setup", lambda: None)
    for name in ("OZ0_HOST", "OZ0_QUEUE", "CELERY_LOG_LEVEL", "OZ0_TEST_TOOLS", "OZ0_WEB_PROCESSES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OZ0_PORT", "8002")
    assert up.cmd_up([]) == 0
    minute = up.WEB_PATIENCE_SECONDS
    assert patience == [minute, minute, minute]
    assert RecordingSupervisor.lines == [
        f"the web process has not answered in {minute}s (a busy machine?): still waiting",
        f"the web process has not answered in {2 * minute}s (a busy machine?): still waiting",
        "the console is at http://127.0.0.1:8002/  (log in with a demo user above; Ctrl-C stops)",
    ]


def test_a_probe_waits_for_a_slow_answer_and_not_for_a_silent_port() -> None:
    """A /healthz that takes longer than a second (a first one on a busy machine) is an answer; a
    port that takes the request and never answers is not, once the probe's time is up."""
    from oz0cli.supervisor import answers

    probed = threading.Event()

    def serve(delay: float | None) -> tuple[socket.socket, threading.Thread]:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def reply() -> None:
            connection, _ = listener.accept()
            with connection:
                connection.recv(4096)
                if delay is None:
                    probed.wait(30)  # silent until the probe has given up
                    return
                time.sleep(delay)  # the slowness under test
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

        thread = threading.Thread(target=reply, daemon=True)
        thread.start()
        return listener, thread

    slow, thread = serve(1.5)
    with slow:
        assert answers("127.0.0.1", slow.getsockname()[1], timeout=10.0)
        thread.join()
    silent, thread = serve(None)
    with silent:
        assert not answers("127.0.0.1", silent.getsockname()[1], timeout=0.5)
        probed.set()
        thread.join()


@pytest.mark.parametrize("value", ["0", "33", "two", "-1", "1e3"])
def test_up_refuses_a_web_process_count_it_cannot_run(value: str) -> None:
    with pytest.raises(Fatal, match="OZ0_WEB_PROCESSES must be a whole number from 1 to 32"):
        processes.web_process_count({"OZ0_WEB_PROCESSES": value})


def test_up_runs_one_web_process_unless_told() -> None:
    assert processes.web_process_count({}) == processes.web_process_count({"OZ0_WEB_PROCESSES": " "}) == 1
    assert processes.web_process_count({"OZ0_WEB_PROCESSES": " 4 "}) == 4
    assert processes.web_process_count({"OZ0_WEB_PROCESSES": "32"}) == 32


def test_serve_refuses_what_it_cannot_guess(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SECRET_KEY", raising=False)
    with pytest.raises(Fatal, match="SECRET_KEY"):
        processes.cmd_serve(["web"])
    monkeypatch.setenv("SECRET_KEY", "x" * 50)
    with pytest.raises(Fatal, match="one role"):
        processes.cmd_serve([])
    with pytest.raises(Fatal, match="web, worker, sessions, beat"):
        processes.command("shell", python="python", host="h", port=1, schedule=Path("s"), environ={})


@pytest.mark.live
def test_up_s_web_processes_share_one_socket_and_a_stopped_one_holds_nobody_up(
    live: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two web processes as `up` runs them, on its one listening socket: with either one frozen
    (SIGSTOP, as a process stuck in a long request is to its event loop), every new request is
    answered by the other; so each of them really serves the socket."""
    import signal

    import httpx

    from oz0cli.supervisor import Supervisor, wait_for_web

    listening = processes.web_socket("127.0.0.1", 0)
    port = listening.getsockname()[1]
    env = {**live.env, **processes.web_environment(live.env)}
    supervisor = Supervisor(env)
    argv = processes.command(
        "web",
        python=sys.executable,
        host="127.0.0.1",
        port=port,
        schedule=tmp_path / "schedule",
        environ=env,
        listening=listening,
    )
    try:
        for name in ("web-1", "web-2"):
            supervisor.start(name, argv, pass_fds=(listening.fileno(),))
        assert wait_for_web("127.0.0.1", port, supervisor, timeout=120)
        webs = [supervisor.child(name).process for name in ("web-1", "web-2")]
        assert all(web is not None and web.poll() is None for web in webs)
        for frozen in webs:
            assert frozen is not None
            os.killpg(frozen.pid, signal.SIGSTOP)
            try:
                for _ in range(12):  # each on a new connection: the kernel gives it to a process calling accept
                    assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=20).status_code == 200
            finally:
                os.killpg(frozen.pid, signal.SIGCONT)
    finally:
        supervisor.stop()
        listening.close()
    # Each process reads its peers' addresses whole (the sign-in throttle and /metrics go by them).
    out = capsys.readouterr().out
    for name in ("web-1", "web-2"):
        assert re.search(rf"{name} +\| 127\.0\.0\.1:\d+ - - \[.*\] \"GET /healthz\" 200", out), out[-3000:]


@pytest.mark.live
def test_serve_web_answers_healthz_on_the_given_port(live: Any, tmp_path: Path) -> None:
    import socket

    import httpx

    from tests.conftest import wait_for

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**live.env, "OZ0_HOST": "127.0.0.1", "OZ0_PORT": str(port), "OZ0_DATA_DIR": str(tmp_path)}
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 - the process's log
    process = subprocess.Popen([str(ROOT / "oz0"), "serve", "web"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

    def healthy() -> int:
        if process.poll() is not None:
            raise AssertionError(f"serve exited {process.returncode}: {(tmp_path / 'serve.log').read_text()[-3000:]}")
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code
        except httpx.HTTPError:
            return 0

    try:
        assert wait_for(healthy, timeout=120, message="serve web to answer") == 200
        # exec'd: the process serve started is daphne itself, so a stop signal reaches the server.
        cmdline = Path(f"/proc/{process.pid}/cmdline").read_bytes().split(b"\0")
        assert b"daphne" in cmdline and b"oz0site.asgi:application" in cmdline
    finally:
        process.terminate()
        process.wait(timeout=20)
        log.close()
