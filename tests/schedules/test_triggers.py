"""Signed triggers: a valid signature starts one run per idempotency key with the mapped input;
a bad signature is 401 and writes nothing; huge, malformed and keyless bodies are typed; the
secret is shown once; the role matrix of their management."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from runs.models import Run
from schedules import triggers
from schedules.models import Trigger, TriggerDelivery
from tests.conftest import Team


def _make(team: Team, agent: str, **extra: Any) -> dict[str, Any]:
    body = {
        "name": "github-prs",
        "run": {"agent": agent},
        "input_template": {"pr": "/pull_request/number", "repo": "/repository/full_name", "source": {"const": "github"}},
        "idempotency": {"header": "X-GitHub-Delivery"},
        **extra,
    }
    status, answer = team.api().post(f"/workspaces/{team.slug}/triggers", body)
    assert status == 201, answer
    return answer


def _post(made: dict[str, Any], payload: Any, *, secret: str | None = None, raw: bytes | None = None, **headers: str) -> Any:
    data = raw if raw is not None else json.dumps(payload).encode()
    sign = triggers.signature(secret if secret is not None else made["secret"], data)
    extra = {"HTTP_X_OZ0_SIGNATURE": sign, **{f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}}
    # As an outside system posts: no session, no CSRF token (the check is enforced here).
    return Client(enforce_csrf_checks=True).post(
        f"/api/v1/triggers/{made['url'].rsplit('/', 1)[1]}", data, content_type="application/json", **extra
    )


PAYLOAD = {"action": "opened", "pull_request": {"number": 42, "title": "x"}, "repository": {"full_name": "acme/app"}}


def test_a_signed_delivery_starts_a_run_with_the_mapped_input_as_the_owner(team: Team, agent: str) -> None:
    made = _make(team, agent)
    response = _post(made, PAYLOAD, **{"X-GitHub-Delivery": "d-1"})
    assert response.status_code == 201, response.content
    run = Run.objects.get(pk=response.json()["run"])
    assert run.input == {"pr": 42, "repo": "acme/app", "source": "github"}
    assert run.created_by == team.users["operator"] and run.agent_name == agent


def test_a_senders_retry_starts_one_run(team: Team, agent: str) -> None:
    made = _make(team, agent)
    first = _post(made, PAYLOAD, **{"X-GitHub-Delivery": "d-1"})
    again = _post(made, PAYLOAD, **{"X-GitHub-Delivery": "d-1"})
    assert again.status_code == 200 and again.json() == {"run": first.json()["run"], "replayed": True}
    assert Run.objects.filter(workspace=team.workspace).count() == 1
    assert _post(made, PAYLOAD, **{"X-GitHub-Delivery": "d-2"}).status_code == 201
    assert Run.objects.filter(workspace=team.workspace).count() == 2


def test_the_key_may_be_a_body_field(team: Team, agent: str) -> None:
    made = _make(team, agent, idempotency={"field": "/pull_request/number"})
    assert _post(made, PAYLOAD).status_code == 201
    assert _post(made, PAYLOAD).json()["replayed"] is True
    missing = _post(made, {"pull_request": {}})
    assert missing.status_code == 400 and missing.json()["error"]["key"] == "missing_idempotency_key"


@pytest.mark.parametrize("signature", ["", "sha256=00", "sha256=" + "0" * 64, "garbage"])
def test_a_bad_signature_is_401_and_writes_nothing(team: Team, agent: str, signature: str) -> None:
    made = _make(team, agent)
    url = made["url"].replace("/api/v1", "")
    response = Client().post(
        f"/api/v1{url}",
        json.dumps(PAYLOAD),
        content_type="application/json",
        HTTP_X_OZ0_SIGNATURE=signature,
        HTTP_X_GITHUB_DELIVERY="d-1",
    )
    assert response.status_code == 401 and response.json()["error"]["key"] == "bad_signature"
    wrong = _post(made, PAYLOAD, secret="not-the-secret", **{"X-GitHub-Delivery": "d-1"})
    assert wrong.status_code == 401
    assert not Run.objects.filter(workspace=team.workspace).exists()
    assert not TriggerDelivery.objects.filter(trigger__workspace=team.workspace).exists()


def test_bad_bodies_are_typed(team: Team, agent: str, settings: Any) -> None:
    made = _make(team, agent)
    assert _post(made, None, raw=b"{not json", **{"X-GitHub-Delivery": "d"}).json()["error"]["key"] == "invalid_json"
    deep = ("[" * 500 + "]" * 500).encode()
    assert _post(made, None, raw=deep, **{"X-GitHub-Delivery": "d"}).status_code == 400
    assert _post(made, PAYLOAD).json()["error"]["key"] == "missing_idempotency_key"
    settings.OZ0_TRIGGER_BODY_MAX = 1024
    huge = _post(made, {"blob": "x" * 5000}, **{"X-GitHub-Delivery": "d"})
    assert huge.status_code == 413 and huge.json()["error"]["key"] == "payload_too_large"
    assert (
        not Run.objects.filter(workspace=team.workspace).exists()
        and not TriggerDelivery.objects.filter(trigger__workspace=team.workspace).exists()
    )


def test_an_unknown_trigger_is_404(team: Team) -> None:
    response = Client().post("/api/v1/triggers/" + "0" * 32, "{}", content_type="application/json")
    assert response.status_code == 404


def test_deliveries_are_rate_limited(team: Team, agent: str, settings: Any) -> None:
    made = _make(team, agent)
    settings.OZ0_RATE_WRITES = 2
    codes = [_post(made, PAYLOAD, **{"X-GitHub-Delivery": f"r-{i}"}).status_code for i in range(4)]
    assert codes[:2] == [201, 201] and codes[2:] == [429, 429]


def test_a_refused_create_records_no_delivery_so_a_retry_may_start_it(team: Team, agent: str, settings: Any) -> None:
    made = _make(team, agent)
    settings.OZ0_QUOTA_ACTIVE_RUNS = 1
    assert _post(made, PAYLOAD, **{"X-GitHub-Delivery": "q-1"}).status_code == 201
    refused = _post(made, PAYLOAD, **{"X-GitHub-Delivery": "q-2"})
    assert refused.status_code == 429 and refused.json()["error"]["key"] == "quota_exceeded"
    assert not TriggerDelivery.objects.filter(key="q-2").exists()


def test_the_secret_is_shown_once_and_never_stored(team: Team, agent: str) -> None:
    made = _make(team, agent)
    row = Trigger.objects.get(pk=made["id"])
    assert made["secret"] not in json.dumps([row.body, row.input_template, row.idempotency, row.secret_salt, row.public_id])
    status, page = team.api().get(f"/workspaces/{team.slug}/triggers")
    assert status == 200 and "secret" not in page["items"][0]


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"input_template": {"a": "no-slash"}}, "invalid_template"),
        ({"input_template": {"a": {"eval": "1+1"}}}, "invalid_template"),
        ({"input_template": [1]}, "invalid_template"),
        ({"idempotency": {"header": "bad header!"}}, "invalid_idempotency"),
        ({"idempotency": None}, "invalid_idempotency"),
        ({"run": {"agent": "x", "input": {}}}, "invalid_run"),
        ({"name": "bad name"}, "invalid_name"),
        ({"extra": 1}, "unknown_field"),
    ],
)
def test_bad_trigger_definitions_are_typed_and_write_nothing(team: Team, agent: str, change: dict[str, Any], key: str) -> None:
    body = {"name": "t", "run": {"agent": agent}, "idempotency": {"header": "X-Id"}, **change}
    status, answer = team.api().post(f"/workspaces/{team.slug}/triggers", body)
    assert status == 400 and answer["error"]["key"] == key
    assert not Trigger.objects.filter(workspace=team.workspace).exists()


@pytest.mark.parametrize(("role", "read", "write"), [("viewer", 200, 403), ("reader", 200, 403), ("outsider", 404, 404)])
def test_the_role_matrix_of_managing_triggers(team: Team, agent: str, role: str, read: int, write: int) -> None:
    made = _make(team, agent)
    api = team.api(role)
    assert api.get(f"/workspaces/{team.slug}/triggers")[0] == read
    body = {"name": "other", "run": {"agent": agent}, "idempotency": {"header": "X-Id"}}
    assert api.post(f"/workspaces/{team.slug}/triggers", body)[0] == write
    assert api.call("DELETE", f"/workspaces/{team.slug}/triggers/{made['id']}")[0] == write
    assert list(Trigger.objects.values_list("name", flat=True)) == ["github-prs"]
    assert team.api().call("DELETE", f"/workspaces/{team.slug}/triggers/{made['id']}")[0] == 204
    status, events = team.api().get(f"/workspaces/{team.slug}/schedule-events")
    operator = team.users["operator"].username
    assert [(e["subject"], e["verb"], e["actor"], e["schedule_name"]) for e in events["items"]] == [
        ("trigger", "deleted", operator, "github-prs"),
        ("trigger", "created", operator, "github-prs"),
    ]


@pytest.mark.usefixtures("committed", "no_dispatch")
def test_two_concurrent_retries_start_one_run() -> None:
    import threading

    from django.db import connection

    from tests.schedules.conftest import agent_of

    team = Team()
    made = _make(team, agent_of(team, "race-hooks"))
    barrier = threading.Barrier(2)
    codes: list[int] = []

    def sender() -> None:
        try:
            barrier.wait()
            codes.append(_post(made, PAYLOAD, **{"X-GitHub-Delivery": "same"}).status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=sender) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(codes) == [200, 201]
    assert Run.objects.filter(workspace=team.workspace).count() == 1
    assert TriggerDelivery.objects.filter(trigger_id=made["id"]).count() == 1
