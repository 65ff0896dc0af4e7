"""Shared fixtures: role users, an API client, and the live stack (a real Celery worker
and beat on the test database, through the real Redis broker)."""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from oz0cli.checks import ENGINE_MARKERS
from oz0site.heap import freeze_startup_heap
from tests.factories import make_member, make_token, make_workspace

pytest_plugins = ["tests.browser"]  # the browser tests' fixtures, one definition for every folder

ROOT = Path(__file__).resolve().parent.parent


def _always_set_up_the_default_database() -> None:
    """pytest-django sets up only the databases the collected tests ask for (`db`, `django_db`).
    Live tests use committed data without `db`, so a session of live tests alone would run the
    worker and the tests on the real database. Make the test database unconditional."""
    import pytest_django.fixtures as django_fixtures

    original = django_fixtures._get_databases_for_setup
    if getattr(original, "_oz0_default", False):
        return

    def with_default(items: Any) -> tuple[set[str], set[str]]:
        aliases, serialized = original(items)
        return {*aliases, "default"}, serialized

    with_default._oz0_default = True  # type: ignore[attr-defined]
    django_fixtures._get_databases_for_setup = with_default


_always_set_up_the_default_database()

if os.environ.get("PYTEST_XDIST_WORKER"):
    from tests import template_database

    template_database.install()

FAST_PASSWORD_HASHER = "django.contrib.auth.hashers.MD5PasswordHasher"


def _hash_passwords_fast() -> None:
    """The fixtures make thousands of users: PBKDF2's million iterations would be most of the
    suite's time. This process and every process it starts (worker, daphne) use a fast hasher."""
    from django.contrib.auth.hashers import get_hashers, get_hashers_by_algorithm

    os.environ["OZ0_PASSWORD_HASHERS"] = FAST_PASSWORD_HASHER
    settings.PASSWORD_HASHERS = [FAST_PASSWORD_HASHER]
    get_hashers.cache_clear()
    get_hashers_by_algorithm.cache_clear()


_hash_passwords_fast()

# A workspace's seconds bucket counts its requests' time in PostgreSQL, which a test lane beside
# three others on two cores stretches many times over: a test's few dozen requests in one
# workspace could spend the production burst (2 s) on the machine's load alone. The suite's
# burst is larger unless the person running it chose one; the bucket's own tests set theirs.
TEST_WEB_SECONDS_BURST = "30"


def _a_burst_for_a_loaded_machine() -> None:
    if "OZ0_WORKSPACE_WEB_SECONDS_BURST" not in os.environ:
        os.environ["OZ0_WORKSPACE_WEB_SECONDS_BURST"] = TEST_WEB_SECONDS_BURST  # the stacks tests start
        settings.OZ0_WORKSPACE_WEB_SECONDS_BURST = float(TEST_WEB_SECONDS_BURST)


_a_burst_for_a_loaded_machine()

# What WhiteNoise's middleware reads when it is built; its index of the static files depends on them.
_STATIC_SETTINGS = (
    "DEBUG",
    "STATIC_ROOT",
    "STATIC_URL",
    "STATICFILES_DIRS",
    "FORCE_SCRIPT_NAME",
    "WHITENOISE_AUTOREFRESH",
    "WHITENOISE_MAX_AGE",
    "WHITENOISE_ALLOW_ALL_ORIGINS",
    "WHITENOISE_CHARSET",
    "WHITENOISE_MIMETYPES",
    "WHITENOISE_ADD_HEADERS_FUNCTION",
    "WHITENOISE_INDEX_FILE",
    "WHITENOISE_IMMUTABLE_FILE_TEST",
    "WHITENOISE_USE_FINDERS",
    "WHITENOISE_STATIC_PREFIX",
    "WHITENOISE_ROOT",
)


def _index_static_files_once() -> None:
    """Django's test Client builds the middleware chain anew for each Client, and WhiteNoise's
    middleware walks and stats every static file (STATIC_ROOT and the finders) when it is built:
    py-spy found half of an xdist worker's time there. The files do not change while a test
    process runs, so it indexes them once for each configuration that shapes the index, and
    every later chain starts from a copy."""
    from whitenoise.middleware import WhiteNoiseMiddleware

    build = WhiteNoiseMiddleware.__init__
    indexed: dict[str, dict[str, Any]] = {}

    def init(self: Any, get_response: Any = None, settings: Any = settings) -> None:
        key = repr([getattr(settings, name, None) for name in _STATIC_SETTINGS])
        files = indexed.get(key)
        if files is None:
            build(self, get_response, settings)
            if not self.autorefresh:  # which looks files up on each request and indexes nothing
                indexed[key] = dict(self.files)
            return
        self.add_files = self.add_files_from_finders = lambda *args, **kwargs: None
        try:
            build(self, get_response, settings)
        finally:
            del self.add_files, self.add_files_from_finders
        self.files = dict(files)

    WhiteNoiseMiddleware.__init__ = init  # type: ignore[method-assign]


_index_static_files_once()


def assert_test_database() -> None:
    name = str(connection.settings_dict["NAME"])
    assert name.startswith("test_"), f"the live stack would run on {name!r}, not a test database"


_exit_status: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status.append(int(exitstatus))


def pytest_unconfigure(config: pytest.Config) -> None:
    """A test interrupted by its timeout inside `async_to_sync` leaves that call's event-loop
    thread waiting for a caller that is gone; the interpreter joins such threads at exit, so the
    session would never end. Once everything is reported, end the process with pytest's status."""
    stuck = [t for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive() and not t.daemon]
    if stuck and _exit_status:
        names = ", ".join(sorted({t.name for t in stuck}))
        sys.stderr.write(f"\ntests: {len(stuck)} thread(s) still running at exit ({names}); ending the session anyway\n")
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(_exit_status[-1])


# Modules whose every test is `thorough`. A run that leaves thorough tests out (`./oz0 test
# --quick`) does not import them: the OpenAPI fuzz builds its schemathesis tests while it is
# collected, which was half of every xdist worker's collection time.
THOROUGH_MODULES = frozenset({"tests/foundation/test_openapi_fuzz.py"})


def leaves_out_thorough(markexpr: str) -> bool:
    """Whether the `-m` expression deselects a test marked `thorough` and nothing else."""
    if not markexpr:
        return False
    from _pytest.mark.expression import Expression

    return not Expression.compile(markexpr).evaluate(lambda name, **_: name == "thorough")


# ENGINE_MARKERS mark the tests that drive a stack (the live, slow and fault lanes). Every test that
# carries one is in a module whose text names it (`mark.live`, …): no hook adds them. A lane that
# selects only such tests skips importing the other modules, three quarters of the suite, which
# every lane otherwise collected (about 20 s of a core each) only to deselect.
_ENGINE_MARK_TEXT = re.compile(rb"\bmark\.(?:" + "|".join(ENGINE_MARKERS).encode() + rb")\b")


@functools.cache  # asked for every path collection meets
def needs_an_engine_marker(markexpr: str) -> bool:
    """Whether the `-m` expression selects only tests that carry one of ENGINE_MARKERS: it is
    false whatever other markers a test has, as long as it has none of those."""
    if not markexpr:
        return False
    from _pytest.mark.expression import Expression

    expression = Expression.compile(markexpr)
    others = sorted(set(re.findall(r"[A-Za-z_]\w*", markexpr)) - {"and", "or", "not", *ENGINE_MARKERS})
    for values in itertools.product((False, True), repeat=len(others)):
        present = {name for name, value in zip(others, values, strict=True) if value}
        if expression.evaluate(lambda name, present=present, **_: name in present):
            return False
    return True


@functools.cache
def names_an_engine_marker(module: Path) -> bool:
    return bool(_ENGINE_MARK_TEXT.search(module.read_bytes()))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if not collection_path.is_relative_to(ROOT):
        return None
    markexpr = str(config.getoption("markexpr") or "")
    listed = str(collection_path.relative_to(ROOT)) in THOROUGH_MODULES
    if listed and leaves_out_thorough(markexpr):
        return True
    a_test_module = collection_path.suffix == ".py" and collection_path.name.startswith("test_")
    if a_test_module and needs_an_engine_marker(markexpr) and not names_an_engine_marker(collection_path):
        return True
    return None


# The first generation's threshold in a test process: Python's default is 700 allocations.
TEST_YOUNG_GENERATION_THRESHOLD = 10_000


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported (Django, oz0, every test module, schemathesis, hypothesis) lives
    as long as the session: frozen out of the collector's full passes, as a long-lived oz0
    process freezes its startup heap (oz0site/heap.py). A test allocates thousands of objects
    (ORM rows, requests, responses) that reference counting frees; a collection every 700 of
    them found little, so the first generation waits for 10,000. In the console tests the
    collector's time fell from 4.6-5.2 s to 1.2 s of 39-41 s of CPU."""
    freeze_startup_heap()
    gc.set_threshold(TEST_YOUNG_GENERATION_THRESHOLD, 10, 10)


def browsers_last(items: list[pytest.Item]) -> None:
    """The tests that use a browser after every other test, in their order: the session's one
    browser (tests/browser.py, `chromium`) leaves an event loop marked running in this thread,
    which `async_to_sync` refuses."""
    items.sort(key=lambda item: "chromium" in getattr(item, "fixturenames", ()))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    browsers_last(items)
    for item in items:
        if str(item.path.relative_to(ROOT)) in THOROUGH_MODULES:
            assert item.get_closest_marker("thorough"), f"{item.nodeid}: its module is listed as thorough only"
        if any(item.get_closest_marker(name) for name in ENGINE_MARKERS):
            # What lets the engine lanes skip modules by their text (pytest_ignore_collect); the
            # rest lane collects every module, so a marker added any other way fails it here.
            assert names_an_engine_marker(item.path), f"{item.nodeid}: its engine marker is not named in its module"
        for marker in item.iter_markers("spec"):
            for spec_id in marker.args:
                assert isinstance(spec_id, str) and spec_id[0] in "FS", f"{item.nodeid}: bad spec id {spec_id!r}"


class LiveStack:
    """The worker and beat processes of one test session, restartable by tests."""

    def __init__(self, env: dict[str, str], workdir: Path) -> None:
        self.env = env
        self.workdir = workdir
        self.worker: subprocess.Popen[bytes] | None = None
        self.sessions: subprocess.Popen[bytes] | None = None
        self.beat: subprocess.Popen[bytes] | None = None
        self.queue = env["OZ0_QUEUE"]

    def _spawn(self, *args: str, log: str) -> subprocess.Popen[bytes]:
        out = open(self.workdir / log, "ab")  # noqa: SIM115 - kept open for the process's life
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "oz0site", *args],
            cwd=ROOT,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def start_worker(self) -> None:
        self.worker = self._spawn(
            "worker",
            "-Q",
            self.queue,
            "-c",
            "4",
            "--pool",
            "prefork",
            "-O",
            "fair",
            "-n",
            f"{self.queue}-{uuid.uuid4().hex[:6]}@%h",
            "--without-gossip",
            "--without-mingle",
            "-l",
            "warning",
            log="worker.log",
        )

    def kill_sessions(self) -> None:
        """SIGKILL the session worker's process group, as a crashed host would end it."""
        assert self.sessions is not None
        os.killpg(self.sessions.pid, signal.SIGKILL)
        self.sessions.wait(timeout=30)
        self.sessions = None

    @contextlib.contextmanager
    def sessions_with(self, **env: str) -> Iterator[LiveStack]:
        """The session worker started again with `env` added to its environment; as it was afterwards."""
        before = dict(self.env)
        self.kill_sessions()
        self.env = {**before, **env}
        self.start_sessions()
        try:
            yield self
        finally:
            if self.sessions is not None:
                self.kill_sessions()
            self.env = before
            self.start_sessions()

    def start_sessions(self) -> None:
        """The session worker, as `./oz0 up` starts it: harnessed rounds (F7) on a thread pool."""
        self.sessions = self._spawn(
            "worker",
            "-Q",
            f"{self.queue}.sessions",
            "--pool",
            "threads",
            "-c",
            "8",
            "-n",
            f"{self.queue}-sessions-{uuid.uuid4().hex[:6]}@%h",
            "--without-gossip",
            "--without-mingle",
            "-l",
            "warning",
            log="sessions.log",
        )

    def start_beat(self) -> None:
        self.beat = self._spawn("beat", "-s", str(self.workdir / "beat-schedule"), "-l", "warning", log="beat.log")

    def worker_children(self) -> list[int]:
        assert self.worker is not None
        out = subprocess.run(["pgrep", "-P", str(self.worker.pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def kill_worker(self, sig: int = signal.SIGKILL) -> None:
        """Kill the whole worker (main process and its children) at once."""
        if self.worker is not None and self.worker.poll() is None:
            os.killpg(self.worker.pid, sig)
            self.worker.wait(timeout=30)
        self.worker = None

    def stop(self) -> None:
        for proc in (self.worker, self.sessions, self.beat):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in (self.worker, self.sessions, self.beat):
            if proc is not None:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)

    def logs(self) -> str:
        parts = []
        for name in ("worker.log", "sessions.log", "beat.log"):
            path = self.workdir / name
            if path.exists():
                parts.append(f"--- {name} ---\n" + path.read_text(errors="replace")[-4000:])
        return "\n".join(parts)


def _database_url() -> str:
    db = connection.settings_dict
    user = db.get("USER") or ""
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    auth = f"{user}{password}@" if user else ""
    host = db.get("HOST") or "localhost"
    if host.startswith("/"):
        return (
            f"postgres:///{db['NAME']}?host={host}"
            + (f"&user={user}" if user else "")
            + (f"&port={db['PORT']}" if db.get("PORT") else "")
        )
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgres://{auth}{host}{port}/{db['NAME']}"


@pytest.fixture(autouse=True, scope="session")
def celery_queue() -> Iterator[str]:
    """This session's own broker queue, so its messages reach only its own worker; dropped at the end."""
    from oz0site.celery import app as celery_app

    queue = f"oz0-test-{uuid.uuid4().hex[:8]}"
    celery_app.conf.task_default_queue = queue
    settings.CELERY_TASK_DEFAULT_QUEUE = queue
    settings.OZ0_WORKER_HEARTBEAT_KEY = f"oz0:worker-heartbeat:{queue}"
    settings.OZ0_SWEEP_HEARTBEAT_KEY = f"oz0:sweep-heartbeat:{queue}"
    settings.OZ0_SESSION_QUEUE = f"{queue}.sessions"
    yield queue
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        client.delete(queue, settings.OZ0_SESSION_QUEUE)
    finally:
        client.close()


@pytest.fixture(autouse=True, scope="session")
def _fresh_rate_windows() -> None:
    """The request rate counters key on the database's name and user (or workspace) ids; a new test database
    hands out the same ids again, so a previous session's counters (of the same window) would
    count against this one's users."""
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        name = settings.DATABASES["default"]["TEST"]["NAME"]
        # The per-person windows and the workspaces' buckets (oz0site.workspace_rate).
        names = [*client.scan_iter(f"oz0:rate:{name}*", count=1000), *client.scan_iter(f"oz0:wsrate:{name}*", count=1000)]
        if names:
            client.delete(*names)
    finally:
        client.close()


def _open_transactions() -> list[Any]:
    """Atomic blocks of the code under test (not the test case's own wrapper)."""
    return [block for block in connection.atomic_blocks if not getattr(block, "_from_testcase", False)]


@pytest.fixture(autouse=True)
def _side_effects_only_after_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any test whose code sends a Celery message or a channel broadcast inside an open transaction."""
    from celery.app.task import Task as CeleryTask

    import oz0site.realtime

    original_apply_async = CeleryTask.apply_async
    original_publish = oz0site.realtime.publish

    def apply_async(self: Any, *args: Any, **kwargs: Any) -> Any:
        assert not _open_transactions(), f"Celery task {self.name} sent inside an open transaction"
        return original_apply_async(self, *args, **kwargs)

    def publish(groups: list[str], event: dict[str, Any]) -> Any:
        assert not _open_transactions(), f"channel broadcast {event.get('type')} sent inside an open transaction"
        return original_publish(groups, event)

    monkeypatch.setattr(CeleryTask, "apply_async", apply_async)
    monkeypatch.setattr(oz0site.realtime, "publish", publish)


def close_other_threads_connections() -> int:
    """Close the database connections of every thread but this one, ended threads' too; how many.

    A connection belongs to the thread that opened it (asgiref's `Local`), and it stays open
    after that thread ends when `DB_CONN_MAX_AGE` keeps connections: an in-process socket's
    `database_sync_to_async` thread, an ASGI request's. Such a session kept the test database
    "accessed by other users" when pytest-django dropped it. The wrapper of another thread may
    not be used here (Django checks), so its driver connection is closed directly."""
    from django.db import connections
    from django.db.backends.base.base import BaseDatabaseWrapper

    ours = {id(connections[alias]) for alias in connections}
    gc.unfreeze()  # a wrapper made before the session froze its heap is found too
    closed = 0
    for wrapper in [o for o in gc.get_objects() if isinstance(o, BaseDatabaseWrapper) and id(o) not in ours]:
        raw = wrapper.connection
        if raw is None or raw.closed:
            continue
        with contextlib.suppress(Exception):  # a connection already broken needs nothing more
            raw.close()
            closed += 1
    return closed


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: Any, django_db_blocker: Any) -> Iterator[None]:
    """pytest-django's test databases, whose teardown (which drops them) comes after this one's:
    no connection a finished thread left open holds them then."""
    yield
    with django_db_blocker.unblock():
        close_other_threads_connections()


@pytest.fixture(scope="session")
def live_stack(django_db_setup: Any, django_db_blocker: Any, celery_queue: str) -> Iterator[LiveStack]:
    """A Celery worker (4 prefork processes, a workspace's share two, as `./oz0 up` starts it) and
    beat, on this session's own queue."""
    queue = celery_queue
    settings.OZ0_TEST_TOOLS = True
    workdir = Path(tempfile.mkdtemp(prefix="oz0-live-"))
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "OZ0_QUEUE": queue,
        "OZ0_TEST_TOOLS": "1",
        "OZ0_WORKER_CONCURRENCY": "4",
        "OZ0_SWEEP_SECONDS": "0.5",
        "OZ0_LEASE_SECONDS": "5",
        "OZ0_HEARTBEAT_SECONDS": "0.5",
        "OZ0_REQUEUE_SECONDS": "3",
        "DEBUG": "1",
        "PYTHONUNBUFFERED": "1",
    }
    stack = LiveStack(env, workdir)
    assert_test_database()
    with django_db_blocker.unblock():
        stack.start_worker()
        stack.start_sessions()
        stack.start_beat()
        try:
            yield stack
        finally:
            stack.stop()
            shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def committed(django_db_setup: Any, django_db_blocker: Any) -> Iterator[None]:
    """Committed data on the test database, for tests whose threads or processes must see their
    rows. Nothing is flushed afterwards (a TRUNCATE would fight the live worker's transactions):
    each test makes its own workspace, as the live tests do."""
    assert_test_database()
    with django_db_blocker.unblock():
        yield


@pytest.fixture
def no_dispatch() -> Iterator[list[int]]:
    """Keep the kernel's Celery sends in a list instead of the broker: the test drives the work itself,
    and a live worker elsewhere in the session must not take it."""
    from runs import kernel

    sent: list[int] = []
    previous = kernel.install_sender(
        lambda ids, chunks, run_id, sessions, priority=5: sent.extend([*ids, *(i for c in chunks for i in c), *sessions])
    )
    yield sent
    kernel.install_sender(previous)


@pytest.fixture
def live(live_stack: LiveStack, django_db_blocker: Any) -> Iterator[LiveStack]:
    """Use in tests that need the worker: the database is shared and committed, not rolled back."""
    with django_db_blocker.unblock():
        if live_stack.worker is None:
            live_stack.start_worker()
        yield live_stack


class Api:
    """A JSON client for /api/v1 acting as one user through a bearer token."""

    def __init__(self, token: str) -> None:
        from django.test import Client

        self.client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")

    def call(self, method: str, path: str, body: Any = None, *, raw: str | bytes | None = None) -> tuple[int, Any]:
        import json

        url = f"/api/v1{path}"
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        kwargs: dict[str, Any] = {"content_type": "application/json"} if data is not None else {}
        response = (
            getattr(self.client, method.lower())(url, data, **kwargs)
            if data is not None
            else getattr(self.client, method.lower())(url)
        )
        try:
            payload = response.json()
        except ValueError:
            payload = response.content.decode(errors="replace")
        return response.status_code, payload

    def get(self, path: str) -> tuple[int, Any]:
        return self.call("GET", path)

    def post(self, path: str, body: Any = None, *, raw: str | bytes | None = None) -> tuple[int, Any]:
        return self.call("POST", path, body if body is not None else ({} if raw is None else None), raw=raw)


class Team:
    """A fresh workspace with one member of each role, and an outsider."""

    def __init__(self) -> None:
        self.workspace = make_workspace()
        self.users = {role: make_member(workspace=self.workspace, role=role) for role in ("operator", "reader", "viewer")}
        from tests.factories import make_user

        self.users["outsider"] = make_user()
        self.tokens = {role: make_token(user=user) for role, user in self.users.items()}

    def api(self, role: str = "operator") -> Api:
        return Api(self.tokens[role])

    @property
    def slug(self) -> str:
        return self.workspace.slug


@pytest.fixture(scope="session")
def openapi_document_built(django_db_setup: Any, django_db_blocker: Any) -> None:
    """The OpenAPI document is built once a process (oz0site/api.py), by whichever request asks
    first. Built inside a test's transaction, on a CI machine at 100 % of both cores, it outlasted
    PostgreSQL's 30 s idle-in-transaction bound and the server ended the test's session (two tests
    that read it, two CI runs). Built here, before any test's transaction."""
    from django.test import Client

    with django_db_blocker.unblock():
        assert Client().get("/api/v1/openapi.json").status_code == 200


@pytest.fixture
def team(db: Any, openapi_document_built: None) -> Team:
    return Team()


@pytest.fixture(scope="module")
def module_transaction(django_db_setup: Any, django_db_blocker: Any) -> Iterator[Any]:
    """For rows several tests of one module read, made once by a module fixture that asks for this
    one (inside `.unblock()` of what it yields): a transaction of the module's own, which each
    test's own (a savepoint inside it) leaves as it found, rolled back after the module's last test.
    Not for a module with transactional tests, whose commits and flushes it would stand in the way of."""
    from django.db import transaction

    with django_db_blocker.unblock():
        atomic = transaction.atomic()
        atomic._from_testcase = True  # a wrapper of the tests', not the code's: see _open_transactions
        atomic.__enter__()
    try:
        yield django_db_blocker
    finally:
        with django_db_blocker.unblock():
            transaction.set_rollback(True)
            atomic.__exit__(None, None, None)


@pytest.fixture
def embedded_data() -> Iterator[Path]:
    """An OZ0_DATA_DIR for `./oz0 up`'s embedded services, outside pytest's temporary folders.
    Run as root, the embedded PostgreSQL runs as the user `pgserver`, who must traverse every
    folder above its data: pgserver opens them to others when it starts, but every pytest process
    (each lane, each xdist worker) that asks for its base temporary folder sets
    /tmp/pytest-of-root back to 0700. A server started after that (a restart after a crash)
    could not reach its own files: `PANIC: could not open file ".../global/pg_control":
    Permission denied` (CI at 774f597, test_up_restarts)."""
    base = Path(tempfile.mkdtemp(prefix="oz0-test-data-"))
    try:
        yield base / "oz0-data"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def live_team(live: LiveStack) -> Team:
    return Team()


def own_session(options: str | None = None, *, autocommit: bool = False) -> psycopg.Connection[Any]:
    """A psycopg session of the test's own to the test database, beside Django's: connected as the
    processes connect, or with `options` as libpq's startup options instead of theirs ("" for
    none, not even the idle-in-transaction bound)."""
    unwanted = ("cursor_factory", "context", "prepare_threshold")
    params = {name: value for name, value in connection.get_connection_params().items() if name not in unwanted}
    if options is not None:
        params["options"] = options
    return psycopg.connect(**params, autocommit=autocommit)


def wait_for(predicate: Any, *, timeout: float = 30.0, interval: float = 0.1, message: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}; last value: {last!r}")


@pytest.fixture(autouse=True, scope="session")
def _test_tools_installed() -> None:
    """The suite runs with the test tools of API.md (OZ0_TEST_TOOLS=1)."""
    settings.OZ0_TEST_TOOLS = True
