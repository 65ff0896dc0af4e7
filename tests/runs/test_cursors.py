"""Keyset cursors are the server's own: a crafted one gets a typed 400 on every paginated API
endpoint (runs, inbox, findings) and the first page on the console's, never a 500."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from django.test import Client

from runs.selectors import encode_cursor
from tests.conftest import Team


def _raw(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


CRAFTED = {
    "no such day": encode_cursor(["2024-02-30T00:00:00", "x"]),
    "one element": encode_cursor(["2024-01-01T00:00:00"]),
    "three elements": encode_cursor(["2024-01-01T00:00:00", "x", "y"]),
    "not a uuid": encode_cursor(["2024-01-01T00:00:00+00:00", "not-a-uuid"]),
    "run id not a uuid": encode_cursor(["2024-01-01T00:00:00+00:00", "run:not-a-uuid"]),
    "task id not a number": encode_cursor(["2024-01-01T00:00:00+00:00", "task:x"]),
    "task id past bigint": encode_cursor(["2024-01-01T00:00:00+00:00", "task:99999999999999999999"]),
    "id past bigint": encode_cursor(["2024-01-01T00:00:00+00:00", 99999999999999999999]),
    "nulls": encode_cursor([None, None]),
    "the last instant": encode_cursor(["9999-12-31T23:59:59", "task:1"]),
    "before year 1 in UTC": encode_cursor(["0001-01-01T00:00:00+05:00", "task:1"]),
    "not a date": encode_cursor(["yesterday", 1]),
    "an object": _raw({"a": 1}),
    "a string": _raw("2024-01-01"),
    "deep": base64.urlsafe_b64encode(b"[" * 5000 + b"]" * 5000).decode(),
    "not base64": "%%%not-base64%%%",
}


def _paths(team: Team) -> list[str]:
    return [f"/workspaces/{team.slug}/runs", "/inbox", f"/inbox?workspace={team.slug}&kind=approval", "/findings"]


@pytest.mark.parametrize("crafted", list(CRAFTED), ids=list(CRAFTED))
def test_it_answers_a_crafted_cursor_with_a_typed_400_on_every_paginated_endpoint(team: Team, crafted: str) -> None:
    for path in _paths(team):
        joiner = "&" if "?" in path else "?"
        status, body = team.api("viewer").get(f"{path}{joiner}cursor={CRAFTED[crafted]}")
        assert status == 400, (path, body)
        assert body["error"]["key"] == "invalid_cursor", (path, body)


def test_it_follows_its_own_cursors_to_the_end(team: Team) -> None:
    for index in range(3):
        status, _ = team.api().post(f"/workspaces/{team.slug}/runs", {"tasks": [{"key": f"q{index}", "kind": "await"}]})
        assert status == 201
    seen: list[str] = []
    path = f"/workspaces/{team.slug}/runs?limit=1"
    while True:
        status, page = team.api("viewer").get(path)
        assert status == 200, page
        seen.extend(item["id"] for item in page["items"])
        if not page["next"]:
            break
        path = f"/workspaces/{team.slug}/runs?limit=1&cursor={page['next']}"
    assert len(seen) == len(set(seen)) == 3


@pytest.mark.parametrize("crafted", ["no such day", "one element", "not a uuid", "the last instant"])
def test_it_shows_the_first_page_for_a_crafted_cursor_in_the_console(team: Team, crafted: str) -> None:
    client = Client()
    client.force_login(team.users["viewer"])
    for url in (f"/w/{team.slug}/inbox/", f"/w/{team.slug}/agents/triage/"):
        response = client.get(url, {"cursor": CRAFTED[crafted]})
        assert response.status_code in (200, 404), (url, response.status_code)
    # The runs list's cursors are signed (runs/run_list.py): a crafted one is refused, typed, on the page.
    response = client.get(f"/w/{team.slug}/runs/", {"cursor": CRAFTED[crafted]})
    assert response.status_code == 400 and 'data-error="invalid_cursor"' in response.content.decode()


@pytest.mark.parametrize(
    "query",
    [
        "until=0001-01-05",
        "until=9999-12-31",
        "since=9999-12-31",
        "since=0001-01-01T00:00:00%2B05:00",
        "version=99999999999999999999",
    ],
)
def test_it_answers_a_scorecard_window_at_the_ends_of_the_calendar_without_a_500(team: Team, query: str) -> None:
    status, registered = team.api().post("/agents", {"manifest": "name: calendar\nmodel: script\n"})
    assert status == 201, registered
    status, body = team.api("viewer").get(f"/insights/agents/calendar?{query}")
    assert status in (200, 400), body
    if status == 400:
        assert body["error"]["key"] == "invalid_query", body


@pytest.mark.parametrize("query", ["since:0001-01-01T00:00:00+05:00", "until:9999-12-31", "since:0001-01-01"])
def test_it_searches_findings_at_the_ends_of_the_calendar_without_a_500(team: Team, query: str) -> None:
    status, body = team.api("viewer").get(f"/findings?q={query.replace('+', '%2B')}")
    assert status in (200, 400), body
