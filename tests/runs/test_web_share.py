"""Each workspace's share of a web process (oz0site/web_share.py, issue 27): a workspace's burst
waits behind itself; another workspace's request runs at once; only members fill a workspace's
queue; the share is given back whatever the request's ending; long waits take none; a workspace whose
requests kept little of the process lately goes first, for a bounded time."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import override_settings

from oz0site import web_share
from runs.models import Run
from tests.conftest import Team

pytestmark = pytest.mark.usefixtures("no_dispatch")


# The tests' workspaces are busy after a tenth of a second with a request in flight, not seconds.
SHORT_MEMORY = 0.01


@pytest.fixture(autouse=True)
def no_share_left(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Iterator[None]:
    monkeypatch.setattr(web_share, "OCCUPANCY_SECONDS", SHORT_MEMORY)
    monkeypatch.setattr(web_share, "NEIGHBOUR_SECONDS", SHORT_MEMORY)
    # The whole share beside neighbours too, but where a test asks for the busy share.
    settings.OZ0_WEB_BUSY_SLOTS = 0
    yield
    shares, quiet = dict(web_share._shares), dict(web_share._quiet)
    in_flight = [each.in_flight for each in web_share._occupancy.values()]
    # Cleared first: one test's leftovers are its own failure, not every later test's.
    web_share._shares.clear()
    web_share._quiet.clear()
    web_share._occupancy.clear()
    assert shares == {}, "a request kept its workspace's share"
    assert quiet == {}, "a quiet request kept its mark"
    assert all(count == 0 for count in in_flight), "a request is still counted in flight"


def _run(team: Team) -> str:
    status, body = team.api().post(
        f"/workspaces/{team.workspace.slug}/runs", {"tasks": [{"key": "q", "kind": "await", "question": "?"}]}
    )
    assert status == 201, body
    return str(body["run"]["id"])


def _held(workspace_id: int, count: int) -> list[HttpRequest]:
    """Requests of the workspace that hold its slots, as long-running ones would."""
    held: list[HttpRequest] = [HttpRequest() for _ in range(count)]
    for request in held:
        web_share.take(request, workspace_id)
    return held


@override_settings(OZ0_WEB_SLOTS_PER_WORKSPACE=2, OZ0_WEB_SLOT_WAIT_SECONDS=0.05)
def test_a_full_share_makes_its_own_workspace_wait_not_another(team: Team) -> None:
    other_team = Team()
    run_id, other_run = _run(team), _run(other_team)
    held = _held(team.workspace.pk, 2)
    try:
        response = team.api("viewer").client.get(f"/api/v1/runs/{run_id}")
        assert response.status_code == 503
        assert response.json()["error"]["key"] == "workspace_busy"
        assert int(response["Retry-After"]) >= 1
        # The other workspace's members are not in this queue.
        assert other_team.api("viewer").get(f"/runs/{other_run}")[0] == 200
        # Nor is an outsider: refused for standing first, it never waits (nor fills it).
        assert team.api("outsider").get(f"/runs/{run_id}")[0] == 404
        assert web_share.in_use(team.workspace.pk) == (2, 0)
    finally:
        for request in held:
            web_share.give_back(request)
    status, body = team.api("viewer").get(f"/runs/{run_id}")
    assert status == 200 and body["id"] == run_id, body


@override_settings(OZ0_WEB_SLOTS_PER_WORKSPACE=1, OZ0_WEB_SLOT_WAIT_SECONDS=0.05)
def test_the_share_is_given_back_whatever_the_ending(team: Team) -> None:
    run_id = _run(team)
    for path, body, want in (
        (f"/runs/{run_id}/tasks/nothing/answer", {"value": 1}, 404),  # the kernel refuses after the share was taken
        (f"/runs/{run_id}/tasks/q/approve", {}, 409),
        (f"/runs/{run_id}/cancel", {}, 200),
        (f"/runs/{run_id}/cancel", {}, 409),
    ):
        status, answer = team.api().post(path, body)
        assert status == want, (path, answer)
        assert web_share.in_use(team.workspace.pk) == (0, 0), path
    # Had a slot leaked, this read would have waited and answered 503.
    assert team.api().get(f"/runs/{run_id}")[0] == 200


@override_settings(OZ0_WEB_SLOTS_PER_WORKSPACE=1, OZ0_WEB_SLOT_WAIT_SECONDS=0.05)
def test_a_long_wait_takes_no_share(team: Team) -> None:
    run_id = _run(team)
    held = _held(team.workspace.pk, 1)
    try:
        seq = Run.objects.get(pk=run_id).last_seq
        status, body = team.api("viewer").get(f"/runs/{run_id}/wait?after={seq - 1}&timeout=0")
        assert status == 200, body
    finally:
        web_share.give_back(held[0])


@override_settings(OZ0_WEB_SLOTS_PER_WORKSPACE=2, OZ0_WEB_SLOT_WAIT_SECONDS=10)
def test_waiting_requests_run_in_arrival_order_as_slots_free() -> None:
    held = _held(7, 2)
    admitted: list[int] = []
    started: list[threading.Event] = []
    threads = []
    for number in range(3):
        started.append(threading.Event())

        def waiter(number: int = number) -> None:
            request = HttpRequest()
            started[number].set()
            web_share.take(request, 7)
            admitted.append(number)
            web_share.give_back(request)

        thread = threading.Thread(target=waiter)
        thread.start()
        threads.append(thread)
        started[number].wait(5)
        # Each waiter is in the queue before the next arrives.
        while web_share.in_use(7)[1] < number + 1:
            threading.Event().wait(0.001)
    assert web_share.in_use(7) == (2, 3)
    other = _held(8, 2)  # another workspace's requests run at once beside the queue
    assert web_share.in_use(8) == (2, 0)
    for request in other:
        web_share.give_back(request)
    web_share.give_back(held[0])
    for thread in threads:
        thread.join(5)
    assert admitted == [0, 1, 2]
    web_share.give_back(held[1])


@override_settings(OZ0_WEB_SLOTS_PER_WORKSPACE=1, OZ0_WEB_SLOT_WAIT_SECONDS=0.02)
def test_a_request_that_gave_up_waiting_leaves_the_queue() -> None:
    held = _held(9, 1)
    with pytest.raises(web_share.WorkspaceBusy):
        web_share.take(HttpRequest(), 9)
    assert web_share.in_use(9) == (1, 0)
    web_share.give_back(held[0])


@override_settings(OZ0_WEB_SLOTS_PER_WORKSPACE=0)
def test_no_share_when_the_setting_is_zero() -> None:
    requests = _held(10, 50)
    assert web_share.in_use(10) == (0, 0)
    for request in requests:
        web_share.give_back(request)


def _closed_loop(workspace_id: int, seconds: float = 20 * SHORT_MEMORY) -> None:
    """The workspace's requests one after another without pause, as a script's loop sends them."""
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        request = HttpRequest()
        web_share.take(request, workspace_id)
        time.sleep(SHORT_MEMORY / 5)
        web_share.give_back(request)


def _busy(workspace_id: int) -> HttpRequest:
    """A request of a busy workspace: one of it was in flight all along, so this one is not quiet."""
    first = _held(workspace_id, 1)[0]
    time.sleep(20 * SHORT_MEMORY)
    second = _held(workspace_id, 1)[0]
    web_share.give_back(first)
    assert not _admitted_quiet(second)
    return second


def _admitted_quiet(request: HttpRequest) -> bool:
    return bool(getattr(request, web_share.SHARE_ATTRIBUTE)[1])


def _take_in_thread(workspace_id: int) -> tuple[threading.Thread, HttpRequest, list[float]]:
    """A request of the workspace asking for its share in a thread; the list gets when it was admitted."""
    request, admitted = HttpRequest(), []

    def ask() -> None:
        web_share.take(request, workspace_id)
        admitted.append(time.monotonic())

    thread = threading.Thread(target=ask)
    thread.start()
    return thread, request, admitted


def test_a_workspace_is_busy_once_its_requests_kept_the_process_busy_and_quiet_again_after() -> None:
    """The average number of a workspace's requests in flight, decaying: a closed loop of one
    request at a time crosses the line after OCCUPANCY_SECONDS x ln(1 / (1 - QUIET_BELOW)); a
    person's request of 0.1 s every second never does; a loop that stopped is quiet again."""
    memory, line = 5.0, web_share.QUIET_BELOW
    loop = web_share._Occupancy(in_flight=1, at=0.0)
    crossing = memory * math.log(1 / (1 - line))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(web_share, "OCCUPANCY_SECONDS", memory)
        assert loop.advance(crossing - 0.01) < line < loop.advance(crossing + 0.01)
        assert loop.advance(60.0) == pytest.approx(1.0, abs=1e-4)
        loop.in_flight = 0
        assert loop.advance(60.0 + memory * math.log(1 / line) + 0.01) < line
        person, highest = web_share._Occupancy(at=0.0), 0.0
        for second in range(600):
            person.advance(float(second))
            person.in_flight = 1
            highest = max(highest, person.advance(second + 0.1))
            person.in_flight = 0
        assert 0.05 < highest < line


def test_a_workspace_idle_long_enough_is_forgotten() -> None:
    """What the process keeps per workspace does not grow with every workspace it ever served."""
    _closed_loop(42)
    _closed_loop(43, seconds=SHORT_MEMORY)
    assert {42, 43} <= set(web_share._occupancy)
    time.sleep(60 * SHORT_MEMORY)  # 42's average decays below FORGOTTEN_BELOW
    web_share.give_back(_held(44, 1)[0])
    assert 42 not in web_share._occupancy and 43 not in web_share._occupancy


@override_settings(OZ0_WEB_SLOTS_PER_WORKSPACE=2, OZ0_WEB_SLOT_WAIT_SECONDS=10, OZ0_WEB_QUIET_FIRST_SECONDS=10)
def test_a_closed_loop_of_one_request_at_a_time_is_busy_and_a_quiet_workspaces_two_requests_are_quiet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: a request was quiet when nothing else of its workspace was in flight. A script
    sending one request the moment the last was answered had every request quiet, and a person's
    two requests at once (a page and its fragment) had the second held back for the script's."""
    _closed_loop(40)
    # The loop's average stays where it is, and a slow machine between the quiet workspace's two
    # requests does not make its second one busy.
    monkeypatch.setattr(web_share, "OCCUPANCY_SECONDS", 5.0)
    web_share.push_is_quiet(40)  # nothing of it in flight now, but its loop kept the process busy
    assert 40 not in web_share._quiet_pushes
    web_share.push_is_quiet(41)
    assert 41 in web_share._quiet_pushes
    web_share._quiet_pushes.clear()
    looped = _held(40, 1)
    quiet = _held(41, 2)
    try:
        assert not _admitted_quiet(looped[0]), "a closed loop's request went first"
        assert all(_admitted_quiet(request) for request in quiet)
        # While the quiet workspace's requests run, the loop's next one in flight waits its turn.
        thread, second, admitted = _take_in_thread(40)
        time.sleep(0.2)
        assert admitted == [] and web_share.in_use(40) == (1, 1)
        for request in quiet:
            web_share.give_back(request)
        thread.join(5)
        assert admitted and web_share.in_use(40) == (2, 0)
        web_share.give_back(second)
    finally:
        for request in (*looped, *quiet):
            web_share.give_back(request)
        web_share._quiet_pushes.clear()


@override_settings(OZ0_WEB_SLOTS_PER_WORKSPACE=2, OZ0_WEB_SLOT_WAIT_SECONDS=10, OZ0_WEB_QUIET_FIRST_SECONDS=10)
def test_a_quiet_workspaces_request_goes_before_a_busy_ones_next() -> None:
    """Before: the busy workspace's second request ran beside the quiet one's at once (its share
    had room), and each that ended was replaced at once: the quiet request shared the interpreter
    with the busy workspace for its whole life."""
    busy = [_busy(11)]  # the busy workspace has a request in flight
    quiet = _held(12, 1)  # the quiet one's only request: it goes first
    thread, second, admitted = _take_in_thread(11)
    try:
        time.sleep(0.2)
        assert admitted == [] and web_share.in_use(11) == (1, 1), "the busy workspace's next request did not wait"
        web_share.give_back(quiet[0])  # the quiet request ends: the held request goes at once
        thread.join(5)
        assert admitted and web_share.in_use(11) == (2, 0)
    finally:
        thread.join(5)
        for request in (*busy, second):
            web_share.give_back(request)


@override_settings(OZ0_WEB_SLOTS_PER_WORKSPACE=2, OZ0_WEB_SLOT_WAIT_SECONDS=10, OZ0_WEB_QUIET_FIRST_SECONDS=0.1)
def test_quiet_first_holds_a_busy_workspace_back_only_for_a_while() -> None:
    busy = [_busy(13)]
    quiet = _held(14, 1)  # stays in flight: a busy workspace is not starved by it
    # A workspace's own requests never wait for its own quiet one.
    quiet += _held(14, 1)
    assert web_share.in_use(14) == (2, 0)
    started = time.monotonic()
    thread, second, admitted = _take_in_thread(13)
    thread.join(5)
    try:
        assert admitted and 0.08 <= admitted[0] - started < 2.0
    finally:
        for request in (*busy, second, *quiet):
            web_share.give_back(request)


@override_settings(OZ0_WEB_SLOTS_PER_WORKSPACE=2, OZ0_WEB_SLOT_WAIT_SECONDS=10, OZ0_WEB_QUIET_FIRST_SECONDS=0)
def test_quiet_first_is_off_at_zero() -> None:
    busy = [_busy(15)]
    quiet = _held(16, 1)
    second = _held(15, 1)  # admitted at once: its share has room
    assert web_share.in_use(15) == (2, 0)
    for request in (*busy, *quiet, *second):
        web_share.give_back(request)


@pytest.mark.usefixtures("committed")
@override_settings(OZ0_WEB_SLOTS_PER_WORKSPACE=2, OZ0_WEB_SLOT_WAIT_SECONDS=10, OZ0_WEB_QUIET_FIRST_SECONDS=10)
def test_a_busy_request_already_running_pauses_before_its_next_query_while_a_quiet_one_runs() -> None:
    """Before: held back at the door only, a busy workspace's requests already in flight ran beside
    the quiet one's to their end (with two of them, the quiet request had a third of the
    interpreter)."""
    from django.db import connection

    first = _held(25, 1)  # the busy workspace has had a request in flight all along: its next is not quiet
    time.sleep(20 * SHORT_MEMORY)
    quiet_in_flight, queried = threading.Event(), threading.Event()

    def view(request: HttpRequest) -> HttpResponse:
        web_share.take(request, 25)  # admitted before the quiet request came
        quiet_in_flight.wait(5)
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
            queried.set()
        finally:
            connection.close()
        return HttpResponse()

    middleware = web_share.WebShareMiddleware(view)
    thread = threading.Thread(target=middleware, args=(HttpRequest(),))
    thread.start()
    while web_share.in_use(25)[0] < 2:
        time.sleep(0.005)
    quiet = _held(26, 1)
    quiet_in_flight.set()
    try:
        assert not queried.wait(0.3), "the busy request's query ran beside the quiet request"
        web_share.give_back(quiet[0])  # the quiet request ends: the paused query goes at once
        assert queried.wait(5)
    finally:
        web_share.give_back(quiet[0])
        thread.join(5)
        web_share.give_back(first[0])
    assert web_share.in_use(25) == (0, 0)


@override_settings(OZ0_WEB_SLOTS_PER_WORKSPACE=2, OZ0_WEB_SLOT_WAIT_SECONDS=10, OZ0_WEB_QUIET_FIRST_SECONDS=0.1)
def test_a_busy_request_pauses_for_quiet_ones_only_within_its_allowance() -> None:
    busy = _busy(27)
    quiet = _held(28, 1)  # never ends while the busy request runs: it must not be starved
    quiet += _held(28, 1)  # a workspace's requests never pause for its own
    try:
        web_share.pause_for_quiet(busy)
        assert getattr(busy, web_share.PAUSE_ATTRIBUTE) == 0.0  # its whole allowance used
        finished = threading.Event()
        thread = threading.Thread(target=lambda: (web_share.pause_for_quiet(busy), finished.set()))
        thread.start()
        assert finished.wait(5), "a busy request paused past its allowance"
        thread.join(5)
        own = threading.Thread(target=web_share.pause_for_quiet, args=(quiet[1],))
        own.start()
        own.join(5)
        assert not own.is_alive() and not hasattr(quiet[1], web_share.PAUSE_ATTRIBUTE)
    finally:
        for request in (busy, *quiet):
            web_share.give_back(request)


@override_settings(OZ0_WEB_SLOTS_PER_WORKSPACE=2, OZ0_WEB_SLOT_WAIT_SECONDS=10, OZ0_WEB_QUIET_FIRST_SECONDS=10)
def test_a_quiet_workspaces_push_holds_busy_requests_for_its_moment_only() -> None:
    """The event loop's part of a quiet workspace's push needs the interpreter as its requests do:
    while it is handed on, a busy workspace's running request pauses and its next waits at the
    door, until the push's moment ends (by its time: no one ends it), never for the allowance."""
    busy = _busy(33)
    web_share.push_is_quiet(34)
    web_share.pause_for_quiet(busy)
    left = getattr(busy, web_share.PAUSE_ATTRIBUTE)
    assert 5 < left < 10, left  # it paused, and not for its allowance
    web_share.push_is_quiet(34)
    thread, second, admitted = _take_in_thread(33)
    thread.join(5)
    assert admitted, "a busy request waited past the push's moment"
    held = _held(35, 1)
    time.sleep(20 * SHORT_MEMORY)
    web_share.push_is_quiet(35)  # a workspace whose requests kept the process busy: its push is not quiet
    assert 35 not in web_share._quiet_pushes
    for request in (busy, second, *held):
        web_share.give_back(request)


@override_settings(OZ0_WEB_QUIET_FIRST_SECONDS=0)
def test_no_push_is_quiet_when_quiet_first_is_off() -> None:
    web_share.push_is_quiet(36)
    assert 36 not in web_share._quiet_pushes


@override_settings(OZ0_WEB_SLOTS_PER_WORKSPACE=2, OZ0_WEB_SLOT_WAIT_SECONDS=10, OZ0_WEB_QUIET_FIRST_SECONDS=10)
def test_a_workspace_that_filled_its_share_is_busy_whatever_its_average(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: a newcomer's burst was quiet until its average crossed the line (a second or so of a
    closed loop's: the neighbors bench's noise went first at the start of each of its windows),
    its request waiting for its own share included."""
    monkeypatch.setattr(web_share, "OCCUPANCY_SECONDS", 5.0)  # the average stays near nothing
    held = _held(50, 2)
    assert all(_admitted_quiet(request) for request in held)  # a person's page and its fragment
    thread, third, admitted = _take_in_thread(50)
    try:
        deadline = time.monotonic() + 5
        while web_share.in_use(50) != (2, 1) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert web_share.in_use(50) == (2, 1)
        web_share.push_is_quiet(50)
        assert 50 not in web_share._quiet_pushes, "a workspace over its share had its push go first"
        web_share.give_back(held.pop())
        thread.join(5)
        assert admitted and not _admitted_quiet(third), "a request that waited for its own share went first"
    finally:
        for request in held:
            web_share.give_back(request)
        thread.join(5)
        web_share.give_back(third)
    web_share.push_is_quiet(50)  # nothing waits now, and its average is low: quiet again
    assert 50 in web_share._quiet_pushes
    web_share._quiet_pushes.clear()


@override_settings(
    OZ0_WEB_SLOTS_PER_WORKSPACE=2, OZ0_WEB_BUSY_SLOTS=1, OZ0_WEB_SLOT_WAIT_SECONDS=10, OZ0_WEB_QUIET_FIRST_SECONDS=0
)
def test_a_busy_workspace_runs_one_request_at_a_time_beside_a_neighbour_and_its_whole_share_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: a busy workspace ran its whole share whenever its requests came, neighbours or not:
    two of its request threads took the interpreter from another workspace's request and from the
    event loop carrying it (the neighbors bench's quiet read, p95 beside / alone: 2.21-2.48x with
    the whole share, 1.41-1.79x with one)."""
    monkeypatch.setattr(web_share, "NEIGHBOUR_SECONDS", 5.0)
    busy = [_busy(60)]
    alone = _held(60, 1)
    assert web_share.in_use(60) == (2, 0), "alone in the process, a busy workspace has its whole share"
    web_share.give_back(alone[0])
    quiet = _held(61, 2)  # a quiet neighbour keeps its whole share beside the busy one
    assert web_share.in_use(61) == (2, 0)
    thread, second, admitted = _take_in_thread(60)
    try:
        time.sleep(0.2)
        assert admitted == [] and web_share.in_use(60) == (1, 1), "beside a neighbour, its second ran at once"
        for request in quiet:
            web_share.give_back(request)
        quiet = []
        time.sleep(0.2)
        assert admitted == [], "the neighbour's requests ended a moment ago: it is still about"
        # The neighbour's last request is further back than NEIGHBOUR_SECONDS: the waiting request
        # looks again by itself (its own first request still runs) and goes.
        monkeypatch.setattr(web_share, "NEIGHBOUR_SECONDS", 0.0)
        thread.join(5)
        assert admitted and web_share.in_use(60) == (2, 0)
    finally:
        thread.join(5)
        for request in (*busy, second, *quiet):
            web_share.give_back(request)


@override_settings(
    OZ0_WEB_SLOTS_PER_WORKSPACE=2, OZ0_WEB_BUSY_SLOTS=1, OZ0_WEB_SLOT_WAIT_SECONDS=10, OZ0_WEB_QUIET_FIRST_SECONDS=0
)
def test_a_neighbours_request_in_flight_counts_however_long_ago_it_came(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(web_share, "NEIGHBOUR_SECONDS", 0.0)
    busy = [_busy(62)]
    neighbour = _held(63, 1)
    thread, second, admitted = _take_in_thread(62)
    try:
        time.sleep(0.2)
        assert admitted == [] and web_share.in_use(62) == (1, 1)
        web_share.give_back(busy.pop())  # its own request ends: the next goes, one at a time still
        thread.join(5)
        assert admitted and web_share.in_use(62) == (1, 0)
    finally:
        thread.join(5)
        for request in (*busy, second, *neighbour):
            web_share.give_back(request)


@pytest.mark.parametrize("busy_slots", [0, 2, 3])
def test_busy_slots_of_zero_or_the_whole_share_change_nothing(busy_slots: int) -> None:
    with override_settings(OZ0_WEB_SLOTS_PER_WORKSPACE=2, OZ0_WEB_BUSY_SLOTS=busy_slots, OZ0_WEB_SLOT_WAIT_SECONDS=10):
        busy = [_busy(64)]
        neighbour = _held(65, 1)
        more = _held(64, 1)
        try:
            assert web_share.in_use(64) == (2, 0)
        finally:
            for request in (*busy, *more, *neighbour):
                web_share.give_back(request)
