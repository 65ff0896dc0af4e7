"""What a request body may hold (S30, S31): the client's text is judged, the byte cap is the wall,
and anything the row store cannot hold is a typed 400 that writes nothing, never a 500."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runs.kernel import MAX_ENTRIES, MAX_PAYLOAD_BYTES, InvalidRequest, check_storable
from runs.models import Run, Task
from runs.schemas import parse_body
from tests.conftest import Team
from tests.runs.driver import echo


def _create_raw(team: Team, raw: str) -> tuple[int, Any]:
    return team.api().post(f"/workspaces/{team.slug}/runs", raw=raw)


def _echo_raw(value_text: str) -> str:
    task = f'{{"key": "a", "kind": "tool", "tool": "test.echo", "args": {{"value": {value_text}}}}}'
    return f'{{"tasks": [{task}], "deliverable": "a"}}'


@pytest.mark.spec("S30")
def test_it_accepts_33000_small_numbers_under_the_byte_cap(team: Team) -> None:
    raw = _echo_raw(json.dumps([0] * 33_000))
    assert len(raw.encode()) < 100_000
    status, body = _create_raw(team, raw)
    assert status == 201, body
    assert len(Task.objects.get(run_id=body["run"]["id"], key="a").spec["args"]["value"]) == 33_000


@pytest.mark.spec("S30")
def test_it_counts_entries_only_above_what_one_mebibyte_can_hold() -> None:
    # The smallest entry is two bytes (`0,`): a body under the byte cap never reaches the count.
    smallest = ("[" + ",".join(["0"] * (MAX_PAYLOAD_BYTES // 2 - 1)) + "]").encode()
    assert len(smallest) < MAX_PAYLOAD_BYTES
    assert len(parse_body(smallest)) == MAX_ENTRIES - 1
    # Stored bodies that never passed the byte cap (a tool's result) still meet the count.
    with pytest.raises(InvalidRequest) as refused:
        check_storable({"rows": [0] * (MAX_ENTRIES + 1)})
    assert refused.value.key == "content_items_too_many"


@pytest.mark.spec("S31")
@pytest.mark.parametrize(
    "literal,stored", [("0.00001", 0.00001), ("12345678901234567890.5", 12345678901234567890.5), ("-0.5", -0.5)]
)
def test_it_judges_a_numbers_form_on_the_clients_text(team: Team, literal: str, stored: float) -> None:
    status, body = _create_raw(team, _echo_raw(literal))
    assert status == 201, body
    # A JSON number is a double (README): the nearest one to the client's decimal is what is kept.
    assert float(Task.objects.get(run_id=body["run"]["id"], key="a").spec["args"]["value"]) == stored


@pytest.mark.spec("S31")
@pytest.mark.parametrize("literal", ["1E5", "1e-05", "0.5e1", "-2.5E+3"])
def test_it_still_refuses_exponent_form_as_the_client_wrote_it(team: Team, literal: str) -> None:
    before = Run.objects.count()
    status, body = _create_raw(team, _echo_raw(literal))
    assert (status, body["error"]["key"]) == (400, "exponent_number"), body
    assert literal in body["error"]["detail"] and Run.objects.count() == before


@pytest.mark.spec("S31")
def test_it_stores_a_float_computed_in_python_whatever_its_repr() -> None:
    check_storable({"tiny": 1e-05, "huge": 1.2345678901234567e19})


@pytest.mark.spec("S31")
@pytest.mark.parametrize(
    "raw,key",
    [
        (_echo_raw("[" * 10_000 + "]" * 10_000), "too_deep"),
        (_echo_raw("[" * 150 + "]" * 150), "too_deep"),
        (_echo_raw("1" * 5_000), "invalid_number"),
        (_echo_raw("1" * 400 + ".5"), "invalid_number"),
        (_echo_raw('"\\ud800"'), "invalid_text"),
        ('{"tasks": [{"key": "a", "kind": "tool", "tool": "test.echo", "args": {"\\ud800": 1}}]}', "invalid_text"),
    ],
)
def test_it_refuses_what_the_row_store_cannot_hold_typed_and_writes_nothing(team: Team, raw: str, key: str) -> None:
    before = Run.objects.count()
    status, body = _create_raw(team, raw)
    assert (status, body["error"]["key"]) == (400, key), body
    assert Run.objects.count() == before


def test_it_refuses_a_body_nested_10000_deep_at_every_door(team: Team) -> None:
    status, created = team.api().post(f"/workspaces/{team.slug}/runs", {"tasks": [{"key": "q", "kind": "await"}]})
    assert status == 201
    run_id, token = created["run"]["id"], created["receipt"]["tokens"]["q"]
    deep = '{"value": ' + "[" * 10_000 + "]" * 10_000 + "}"
    seq = Run.objects.get(pk=run_id).last_seq
    for path in (f"/runs/{run_id}/append", f"/awaits/{token}", f"/runs/{run_id}/tasks/q/answer", "/agents/lint", "/executors"):
        status, body = team.api().post(path, raw=deep)
        assert (status, body["error"]["key"]) == (400, "too_deep"), (path, body)
    assert Run.objects.get(pk=run_id).last_seq == seq


@pytest.mark.parametrize("timeout", ["100000000000000", "31622401", "0", "-1"])
def test_it_refuses_an_await_clock_no_deadline_can_hold(team: Team, timeout: str) -> None:
    before = Run.objects.count()
    raw = f'{{"tasks": [{{"key": "q", "kind": "await", "timeout_s": {timeout}}}], "deliverable": "q"}}'
    status, body = _create_raw(team, raw)
    assert (status, body["error"]["key"]) == (400, "invalid_field"), body
    assert "timeout_s" in body["error"]["detail"] and Run.objects.count() == before


def test_it_refuses_an_await_clock_of_1e14_at_the_append_door_too(team: Team) -> None:
    status, created = team.api().post(f"/workspaces/{team.slug}/runs", {"tasks": [echo("a")], "deliverable": "a"})
    run_id = created["run"]["id"]
    seq = Run.objects.get(pk=run_id).last_seq
    status, body = team.api().post(
        f"/runs/{run_id}/append", raw='{"tasks": [{"key": "q", "kind": "await", "timeout_s": 100000000000000}]}'
    )
    assert (status, body["error"]["key"]) == (400, "invalid_field"), body
    assert Run.objects.get(pk=run_id).last_seq == seq and not Task.objects.filter(run_id=run_id, key="q").exists()


def test_it_keeps_an_await_clock_of_a_year(team: Team) -> None:
    status, body = _create_raw(team, '{"tasks": [{"key": "q", "kind": "await", "timeout_s": 31536000}], "deliverable": "q"}')
    assert status == 201, body
    task = Task.objects.get(run_id=body["run"]["id"], key="q")
    assert task.deadline_at is not None and (task.deadline_at - task.started_at).days == 365


@pytest.mark.parametrize(
    "path", ["/runs/{run}/cancel", "/runs/{run}/tasks/q/deny", "/runs/{run}/tasks/q/answer", "/awaits/{token}"]
)
def test_it_refuses_a_body_that_is_not_an_object_typed(team: Team, path: str) -> None:
    status, created = team.api().post(f"/workspaces/{team.slug}/runs", {"tasks": [{"key": "q", "kind": "await"}]})
    run_id, token = created["run"]["id"], created["receipt"]["tokens"]["q"]
    seq = Run.objects.get(pk=run_id).last_seq
    status, body = team.api().post(path.format(run=run_id, token=token), raw="[null, null]")
    assert (status, body["error"]["key"]) == (400, "invalid_request"), body
    assert Run.objects.get(pk=run_id).last_seq == seq


@pytest.mark.spec("S31")
@pytest.mark.parametrize(
    "path",
    [
        "/workspaces/a%00b/runs",
        "/workspaces/{ws}/runs?agent=a%00b",
        "/inbox?workspace=a%00b",
        "/findings?q=agent:a%00b",
        "/insights/agents/a%00b",
        "/agents/a%00b",
        "/test/effects/a%00b",
    ],
)
def test_it_refuses_a_nul_in_the_path_or_the_query_typed(team: Team, path: str) -> None:
    status, body = team.api("viewer").get(path.format(ws=team.slug))
    assert (status, body["error"]["key"]) == (400, "nul_byte"), body


def test_it_refuses_a_nul_in_a_console_url_with_a_400(team: Team) -> None:
    from django.test import Client

    client = Client()
    client.force_login(team.users["viewer"])
    assert client.get(f"/w/{team.slug}/runs/", {"agent": "a\x00b"}).status_code == 400


@pytest.mark.parametrize(
    "raw,created",
    [
        ('"retry": {"budget": 1.0}', True),
        ('"retry": {"budget": 1.5}', False),
        ('"retry": {"budget": true}', False),
    ],
)
def test_a_whole_number_float_is_the_integer_it_is(team: Team, raw: str, created: bool) -> None:
    """JSON has one number type, and the document's `integer` calls 1.0 a whole number (issue 27.8)."""
    tasks = '[{"key": "a", "kind": "tool", "tool": "test.echo", "args": {}}]'
    status, body = _create_raw(team, f'{{"tasks": {tasks}, {raw}}}')
    if created:
        assert status == 201, body
        assert Run.objects.get(pk=body["run"]["id"]).retry_budget == 1
    else:
        assert (status, body["error"]["key"]) == (400, "invalid_field"), body


def test_a_quorum_of_2_0_is_a_quorum_of_2(team: Team) -> None:
    sources = '{"key": "a", "kind": "tool", "tool": "test.echo", "args": {}}, {"key": "b", "kind": "tool", "tool": "test.echo", "args": {}}'
    join = '{"key": "j", "kind": "join", "after": ["a", "b"], "mode": "quorum", "quorum": 2.0}'
    status, body = _create_raw(team, f'{{"tasks": [{sources}, {join}], "deliverable": "j"}}')
    assert status == 201, body
    assert Task.objects.get(run_id=body["run"]["id"], key="j").spec["quorum"] == 2
    status, body = _create_raw(team, f'{{"tasks": [{sources}, {join.replace("2.0", "1.5")}], "deliverable": "j"}}')
    assert (status, body["error"]["key"]) == (400, "invalid_field"), body
