"""The schedules API: the role matrix, bad input typed (never a 500, nothing written), the next
fire times, pause/resume/change/delete and the audit trail."""

from __future__ import annotations

from typing import Any

import pytest

from schedules.models import Schedule, ScheduleEvent
from tests.conftest import Team
from tests.schedules.conftest import schedule_body


def _url(team: Team, tail: str = "") -> str:
    return f"/workspaces/{team.slug}/schedules{tail}"


def _create(team: Team, agent: str, **extra: Any) -> dict[str, Any]:
    status, body = team.api().post(_url(team), schedule_body(agent, **extra))
    assert status == 201, body
    return body


def test_it_creates_a_cron_schedule_and_shows_its_next_fire_times_in_its_zone(team: Team, agent: str) -> None:
    body = _create(team, agent, cron="30 9 * * 1-5", timezone="America/New_York")
    assert body["cron"] == "30 9 * * 1-5" and body["timezone"] == "America/New_York"
    assert len(body["next_fire_times"]) == 5
    # 09:30 in New York is 14:30 or 13:30 UTC (winter or summer time), on weekdays only.
    from datetime import datetime

    for text in body["next_fire_times"]:
        at = datetime.fromisoformat(text)
        assert (at.hour, at.minute) in ((14, 30), (13, 30)) and at.weekday() < 5
    assert ScheduleEvent.objects.filter(schedule_id=body["id"], verb="created").exists()


def test_it_creates_an_interval_schedule(team: Team, agent: str) -> None:
    body = _create(team, agent, cron=None, interval_seconds=3600)
    assert body["interval_seconds"] == 3600 and body["cron"] is None
    from datetime import datetime

    times = [datetime.fromisoformat(t) for t in body["next_fire_times"]]
    assert all((b - a).total_seconds() == 3600 for a, b in zip(times, times[1:], strict=False))


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"cron": "61 * * * *"}, "invalid_cron"),
        ({"cron": "* * *"}, "invalid_cron"),
        ({"cron": "*/5 * * * * *"}, "invalid_cron"),
        ({"cron": "0 0 30 2 *"}, "invalid_cron"),
        ({"cron": "x" * 5000}, "invalid_cron"),
        ({"cron": ["0", "3"]}, "invalid_cron"),
        ({"timezone": "Mars/Olympus"}, "unknown_timezone"),
        ({"timezone": "../../etc/passwd"}, "unknown_timezone"),
        ({"timezone": {"a": 1}}, "unknown_timezone"),
        ({"cron": None, "interval_seconds": 5}, "invalid_interval"),
        ({"cron": None, "interval_seconds": 10**30}, "invalid_interval"),
        ({"cron": None, "interval_seconds": "60"}, "invalid_interval"),
        ({"interval_seconds": 3600}, "invalid_timing"),
        ({"cron": None}, "invalid_timing"),
        ({"overlap": "explode"}, "invalid_overlap"),
        ({"catch_up": 0}, "invalid_catch_up"),
        ({"catch_up": 1000}, "invalid_catch_up"),
        ({"name": "no spaces allowed"}, "invalid_name"),
        ({"name": "x" * 65}, "invalid_name"),
        ({"surprise": 1}, "unknown_field"),
        ({"run": "triage"}, "invalid_run"),
        ({"run": {"agent": "no-such-agent"}}, None),
        ({"run": {"tasks": [{"key": "a", "kind": "tool"}]}}, None),
        ({"run": {"agent": "nightly-report", "bogus": True}}, None),
        ({"paused": "yes"}, "invalid_field"),
    ],
)
def test_it_refuses_bad_input_typed_and_writes_nothing(team: Team, agent: str, change: dict[str, Any], key: str | None) -> None:
    body = {k: v for k, v in {**schedule_body(agent), **change}.items() if v is not None or k != "cron"}
    if change.get("cron", "") is None:
        body.pop("cron", None)
    status, answer = team.api().post(_url(team), body)
    assert status == 400, answer
    if key is not None:
        assert answer["error"]["key"] == key
    else:  # the kernel's own compile refused the run body, with its own key
        assert answer["error"]["key"] and answer["error"]["detail"]
    assert not Schedule.objects.filter(workspace=team.workspace).exists()
    assert not ScheduleEvent.objects.filter(workspace=team.workspace).exists()


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        "[1, 2]",
        '{"name": "a", "run": ' + "[" * 300 + "]" * 300 + "}",
        '{"name": "a", "run": {"agent": "x", "input": 1e400}}',
    ],
)
def test_it_refuses_malformed_and_nested_junk_typed(team: Team, agent: str, raw: str) -> None:
    status, answer = team.api().post(_url(team), raw=raw)
    assert status == 400, answer
    assert answer["error"]["key"]
    assert not Schedule.objects.filter(workspace=team.workspace).exists()


def test_it_refuses_a_huge_payload_413(team: Team, agent: str) -> None:
    body = schedule_body(agent)
    body["run"]["input"] = {"blob": "x" * (2 * 1024 * 1024)}
    status, answer = team.api().post(_url(team), body)
    assert status == 413 and answer["error"]["key"] == "payload_too_large"
    assert not Schedule.objects.filter(workspace=team.workspace).exists()


def test_it_refuses_a_second_schedule_of_the_same_name_409(team: Team, agent: str) -> None:
    _create(team, agent)
    status, answer = team.api().post(_url(team), schedule_body(agent))
    assert status == 409 and answer["error"]["key"] == "name_taken"
    assert Schedule.objects.filter(workspace=team.workspace).count() == 1


@pytest.mark.parametrize("role", ["viewer", "reader"])
def test_viewers_and_readers_read_but_cannot_manage(team: Team, agent: str, role: str) -> None:
    made = _create(team, agent)
    api = team.api(role)
    status, page = api.get(_url(team))
    assert status == 200 and [s["name"] for s in page["items"]] == ["nightly"]
    # The stored body is content: a reader sees it, a viewer does not.
    assert (page["items"][0]["run"] is None) == (role == "viewer")
    assert page["items"][0]["next_fire_times"]
    status, one = api.get(_url(team, f"/{made['id']}"))
    assert status == 200 and one["agent"] == agent
    assert api.get(_url(team, f"/{made['id']}/firings"))[0] == 200
    assert api.get(f"/workspaces/{team.slug}/schedule-events")[0] == 200
    before = ScheduleEvent.objects.filter(workspace=team.workspace).count()
    for method, tail, body in [
        ("POST", "", schedule_body(agent, name="other")),
        ("POST", f"/{made['id']}/pause", None),
        ("POST", f"/{made['id']}/resume", None),
        ("PATCH", f"/{made['id']}", {"overlap": "queue"}),
        ("DELETE", f"/{made['id']}", None),
    ]:
        status, answer = api.call(method, _url(team, tail), body)
        assert status == 403 and answer["error"]["key"] == "forbidden", (method, tail)
    assert Schedule.objects.filter(workspace=team.workspace).count() == 1
    assert ScheduleEvent.objects.filter(workspace=team.workspace).count() == before


def test_an_outsider_gets_404_everywhere(team: Team, agent: str) -> None:
    made = _create(team, agent)
    api = team.api("outsider")
    for method, tail, body in [
        ("GET", "", None),
        ("GET", f"/{made['id']}", None),
        ("GET", f"/{made['id']}/firings", None),
        ("POST", "", schedule_body(agent, name="other")),
        ("POST", f"/{made['id']}/pause", None),
        ("PATCH", f"/{made['id']}", {"overlap": "queue"}),
        ("DELETE", f"/{made['id']}", None),
    ]:
        status, answer = api.call(method, _url(team, tail), body)
        assert status == 404, (method, tail, answer)
    assert api.get(f"/workspaces/{team.slug}/schedule-events")[0] == 404
    assert Schedule.objects.filter(workspace=team.workspace).count() == 1


def test_another_workspaces_schedule_is_404(team: Team, agent: str) -> None:
    made = _create(team, agent)
    other = Team()
    status, _ = other.api().get(f"/workspaces/{other.slug}/schedules/{made['id']}")
    assert status == 404
    assert other.api().get(f"/workspaces/{other.slug}/schedules/{2**70}")[0] in (400, 404)
    assert other.api().get(f"/workspaces/{other.slug}/schedules/{made['id']}/firings?cursor=%%%")[0] in (400, 404)


def test_it_pauses_resumes_changes_and_deletes_with_an_audit_trail(team: Team, agent: str) -> None:
    made = _create(team, agent)
    api = team.api()
    status, paused = api.post(_url(team, f"/{made['id']}/pause"))
    assert status == 200 and paused["paused"] is True and paused["next_fire_times"] == []
    assert api.post(_url(team, f"/{made['id']}/pause"))[1]["error"]["key"] == "already_paused"
    status, resumed = api.post(_url(team, f"/{made['id']}/resume"))
    assert status == 200 and resumed["paused"] is False and len(resumed["next_fire_times"]) == 5
    status, changed = api.call("PATCH", _url(team, f"/{made['id']}"), {"interval_seconds": 600, "overlap": "cancel"})
    assert status == 200 and changed["cron"] is None and changed["interval_seconds"] == 600 and changed["overlap"] == "cancel"
    status, answer = api.call("PATCH", _url(team, f"/{made['id']}"), {"timezone": "Nowhere/Land"})
    assert status == 400 and answer["error"]["key"] == "unknown_timezone"
    assert api.call("DELETE", _url(team, f"/{made['id']}"))[0] == 204
    assert api.get(_url(team, f"/{made['id']}"))[0] == 404
    status, events = api.get(f"/workspaces/{team.slug}/schedule-events")
    assert status == 200
    operator = team.users["operator"].username
    assert [(e["verb"], e["actor"], e["schedule_name"]) for e in events["items"]] == [
        ("deleted", operator, "nightly"),
        ("changed", operator, "nightly"),
        ("resumed", operator, "nightly"),
        ("paused", operator, "nightly"),
        ("created", operator, "nightly"),
    ]
    assert events["items"][1]["changes"]["fields"] == ["interval_seconds", "overlap"]


def test_the_audit_trail_pages_with_a_cursor(team: Team, agent: str) -> None:
    made = _create(team, agent)
    api = team.api()
    for _ in range(30):
        api.post(_url(team, f"/{made['id']}/pause"))
        api.post(_url(team, f"/{made['id']}/resume"))
    status, first = api.get(f"/workspaces/{team.slug}/schedule-events")
    assert status == 200 and len(first["items"]) == 50 and first["next"]
    status, second = api.get(f"/workspaces/{team.slug}/schedule-events?cursor={first['next']}")
    assert status == 200 and len(second["items"]) == 11 and second["next"] is None
    assert api.get(f"/workspaces/{team.slug}/schedule-events?cursor=bm90LWEtbGlzdA")[1]["error"]["key"] == "invalid_cursor"
