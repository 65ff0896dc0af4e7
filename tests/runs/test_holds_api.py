"""POST /api/v1/workspaces/{ws}/holds/retry|abandon: bulk repair with a filter, a preview count,
per-run results, the role matrix, typed refusals, and exactly-once under a racing second operator."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from runs.holds import BULK_CAP, HoldFilter, select_held_runs
from runs.models import Run, Task, TraceEvent
from tests.conftest import Team
from tests.console import states
from tests.console.bulk_holds import held, verb_events

RETRY = "/workspaces/{ws}/holds/retry"
ABANDON = "/workspaces/{ws}/holds/abandon"


def path(team: Team, template: str = RETRY) -> str:
    return template.format(ws=team.slug)


def still_held(*runs: Run) -> bool:
    return (
        all(Run.objects.get(pk=run.pk).status == "needs_attention" for run in runs)
        and not TraceEvent.objects.filter(run__in=runs, event="verb").exists()
    )


@pytest.mark.django_db
@pytest.mark.spec("S14")
@pytest.mark.parametrize("template", [RETRY, ABANDON])
@pytest.mark.parametrize(("role", "status"), [("operator", 200), ("reader", 403), ("viewer", 403), ("outsider", 404)])
def test_it_lets_only_an_operator_repair_in_bulk(
    team: Team, no_dispatch: list[int], template: str, role: str, status: int
) -> None:
    run = held(team.workspace, team.users["operator"])
    code, body = team.api(role).post(path(team, template), {"runs": [str(run.pk)]})
    assert code == status, body
    if status == 200:
        assert [r["outcome"] for r in body["results"]] == ["retried" if template == RETRY else "abandoned"]
    else:
        assert body["error"]["key"] == ("forbidden" if status == 403 else "not_found")
        assert still_held(run)


@pytest.mark.django_db
def test_it_asks_who_is_calling(team: Team) -> None:
    response = Client().post(f"/api/v1{path(team)}", {"all": True}, content_type="application/json")
    assert response.status_code == 401


@pytest.mark.django_db
@pytest.mark.spec("S14")
def test_a_viewer_with_a_malformed_filter_is_still_forbidden(team: Team) -> None:
    code, body = team.api("viewer").post(path(team), raw="{not json")
    assert code == 403 and body["error"]["key"] == "forbidden"


@pytest.mark.django_db
@pytest.mark.spec("S14", "S15")
def test_its_preview_counts_exactly_the_runs_it_then_repairs(team: Team, no_dispatch: list[int]) -> None:
    operator = team.users["operator"]
    states.agent("triage", team.workspace)
    chosen = [held(team.workspace, operator, agent="triage") for _ in range(4)]
    other = held(team.workspace, operator)  # no agent: the filter leaves it alone
    api = team.api()
    code, preview = api.post(path(team), {"agent": "triage", "dry_run": True})
    assert code == 200, preview
    assert preview["dry_run"] is True and preview["count"] == 4 and preview["more"] is False and preview["cap"] == BULK_CAP
    assert [item["run"] for item in preview["runs"]] == [str(run.pk) for run in chosen]  # oldest hold first
    assert all(item["task_keys"] == ["t0"] and item["kinds"] == ["tool_failed"] for item in preview["runs"])
    assert still_held(*chosen, other), "a preview writes nothing"

    code, done = api.post(path(team), {"agent": "triage"})
    assert code == 200, done
    assert done["count"] == preview["count"] == 4 and done["skipped"] == 0
    assert [(r["run"], r["task_keys"], r["outcome"]) for r in done["results"]] == [
        (item["run"], ["t0"], "retried") for item in preview["runs"]
    ]
    for run in chosen:
        assert Run.objects.get(pk=run.pk).status == "running"
        assert Task.objects.get(run=run, key="t0").failure_resolution == "retried"
        assert verb_events(run, "retry") == {"t0": 1}
    assert still_held(other)


@pytest.mark.django_db
@pytest.mark.spec("S14", "S15")
def test_it_abandons_in_bulk_as_one_click_would(team: Team, no_dispatch: list[int]) -> None:
    runs = [held(team.workspace, team.users["operator"]) for _ in range(3)]
    code, body = team.api().post(path(team, ABANDON), {"runs": [str(run.pk) for run in runs]})
    assert code == 200, body
    assert [r["outcome"] for r in body["results"]] == ["abandoned"] * 3
    for run in runs:
        assert Task.objects.get(run=run, key="t0").failure_resolution == "abandoned"
        assert Task.objects.get(run=run, key="c").status == "skipped"  # its dependent is skipped, as one click does
        assert verb_events(run, "abandon") == {"t0": 1}


@pytest.mark.django_db
@pytest.mark.spec("S15")
def test_kind_and_error_key_choose_among_a_runs_candidates(team: Team, no_dispatch: list[int]) -> None:
    operator = team.users["operator"]
    mixed = held(team.workspace, operator, errors=("tool_failed", "tool_timeout"))
    plain = held(team.workspace, operator)
    api = team.api()
    code, body = api.post(path(team), {"kind": "timeout", "dry_run": True})
    assert code == 200 and [(i["run"], i["task_keys"]) for i in body["runs"]] == [(str(mixed.pk), ["t1"])]
    code, body = api.post(path(team), {"error_key": "tool_failed", "dry_run": True})
    assert code == 200 and [(i["run"], i["task_keys"]) for i in body["runs"]] == [
        (str(mixed.pk), ["t0"]),
        (str(plain.pk), ["t0"]),
    ]

    code, body = api.post(path(team), {"kind": "timeout"})
    assert code == 200 and body["results"] == [{"run": str(mixed.pk), "task_keys": ["t1"], "outcome": "retried"}]
    assert verb_events(mixed, "retry") == {"t1": 1}  # t0, another kind, is left as it was
    assert Task.objects.get(run=mixed, key="t0").failure_resolution is None


@pytest.mark.django_db
@pytest.mark.spec("S15")
def test_version_and_age_filters(team: Team, no_dispatch: list[int]) -> None:
    operator = team.users["operator"]
    states.agent("bot", team.workspace, version=1)
    first = held(team.workspace, operator, agent="bot")
    states.agent("bot", team.workspace, version=2)
    second = held(team.workspace, operator, agent="bot")
    Run.objects.filter(pk=first.pk).update(held_since=timezone.now() - timedelta(hours=2))
    api = team.api()

    def chosen(body: dict[str, Any]) -> list[str]:
        code, answer = api.post(path(team), {**body, "dry_run": True})
        assert code == 200, answer
        return [item["run"] for item in answer["runs"]]

    assert chosen({"agent": "bot", "version": 1}) == [str(first.pk)]
    assert chosen({"version": 2}) == [str(second.pk)]
    assert chosen({"min_age_seconds": 3600}) == [str(first.pk)]
    assert chosen({"all": True}) == [str(first.pk), str(second.pk)]
    assert chosen({"agent": "nobody"}) == []


@pytest.mark.django_db
@pytest.mark.spec("S15")
def test_a_whole_number_float_is_the_version_it_is(team: Team, no_dispatch: list[int]) -> None:
    """JSON has one number type: the document's `integer` calls 1.0 the whole number 1 (issue 27.8)."""
    states.agent("bot", team.workspace, version=1)
    first = held(team.workspace, team.users["operator"], agent="bot")
    api = team.api()
    for raw in ('{"version": 1.0, "dry_run": true}', '{"min_age_seconds": 0.0, "version": 1, "dry_run": true}'):
        code, answer = api.post(path(team), raw=raw)
        assert code == 200 and [item["run"] for item in answer["runs"]] == [str(first.pk)], answer
    for raw in ('{"version": 1.5}', '{"version": true}', '{"version": "1"}', '{"min_age_seconds": 0.5}'):
        code, answer = api.post(path(team), raw=raw)
        assert (code, answer["error"]["key"]) == (400, "invalid_filter"), (raw, answer)
    assert still_held(first)


@pytest.mark.django_db
@pytest.mark.spec("S14")
def test_a_run_it_cannot_repair_is_skipped_with_the_reason(team: Team, no_dispatch: list[int]) -> None:
    operator = team.users["operator"]
    repaired = held(team.workspace, operator)
    elsewhere_team = Team()
    elsewhere = held(elsewhere_team.workspace, elsewhere_team.users["operator"])
    api = team.api()
    assert api.post(path(team), {"runs": [str(repaired.pk)]})[1]["results"][0]["outcome"] == "retried"
    code, body = api.post(path(team), {"runs": [str(repaired.pk), str(elsewhere.pk), str(uuid.uuid4())], "dry_run": True})
    assert code == 200 and body["count"] == 0 and body["runs"] == []
    # An explicit list repaired by someone else meanwhile: the console's confirm sends the previewed ids.
    from runs.repair import repair_runs

    results = repair_runs(team.workspace, operator, "retry", HoldFilter(runs=(repaired.pk,)), [repaired.pk, elsewhere.pk])
    assert [r["outcome"] for r in results] == ["skipped", "skipped"]
    assert results[0]["reason"] == "not_held" and f"retried by {operator.username}" in results[0]["detail"]
    assert results[1]["reason"] == "not_held" and results[1]["detail"] == "no such held run in this workspace"
    assert verb_events(repaired, "retry") == {"t0": 1}
    assert still_held(elsewhere)


@pytest.mark.django_db
def test_it_caps_what_one_request_repairs(team: Team, no_dispatch: list[int]) -> None:
    runs = [held(team.workspace, team.users["operator"]) for _ in range(3)]
    chosen, more = select_held_runs(team.workspace, HoldFilter(all=True), cap=2)
    assert [item["run"] for item in chosen] == [str(run.pk) for run in runs[:2]] and more is True
    code, body = team.api().post(path(team), {"runs": [str(uuid.uuid4()) for _ in range(BULK_CAP + 1)]})
    assert code == 400 and body["error"]["key"] == "too_many_runs"


BAD = [
    ([1, 2], "invalid_request"),
    ({"agnt": "x"}, "unknown_field"),
    ({}, "empty_filter"),
    ({"dry_run": True}, "empty_filter"),
    ({"kind": "no_such_kind"}, "invalid_kind"),
    ({"kind": 5}, "invalid_filter"),
    ({"agent": ""}, "invalid_filter"),
    ({"agent": "x" * 101}, "invalid_filter"),
    ({"agent": {"nested": {"deeper": [1]}}}, "invalid_filter"),
    ({"version": "3"}, "invalid_filter"),
    ({"version": 0}, "invalid_filter"),
    ({"version": True}, "invalid_filter"),
    ({"min_age_seconds": -1}, "invalid_filter"),
    ({"min_age_seconds": 10**12}, "invalid_filter"),
    ({"runs": "all"}, "invalid_filter"),
    ({"runs": []}, "invalid_filter"),
    ({"runs": ["not-a-uuid"]}, "invalid_run_id"),
    ({"runs": [{"id": 1}]}, "invalid_run_id"),
    ({"runs": ["0" * 1000]}, "invalid_run_id"),
    ({"all": "yes"}, "invalid_filter"),
    ({"all": True, "dry_run": "true"}, "invalid_filter"),
]


@pytest.mark.django_db
def test_a_bad_filter_is_a_typed_400_that_writes_nothing(team: Team, no_dispatch: list[int]) -> None:
    run = held(team.workspace, team.users["operator"])
    api = team.api()
    for template in (RETRY, ABANDON):
        for body, key in BAD:
            code, answer = api.post(path(team, template), body)
            assert (code, answer["error"]["key"]) == (400, key), (template, body, answer)
    assert still_held(run)


MALFORMED = [
    ("{not json", "invalid_json"),
    ('{"agent": "a\\u0000b"}', "nul_byte"),
    ("[" * 5000 + "]" * 5000, "too_deep"),
    ('{"version": 1e3}', "exponent_number"),
]


@pytest.mark.django_db
def test_a_malformed_body_is_a_typed_400(team: Team, no_dispatch: list[int]) -> None:
    run = held(team.workspace, team.users["operator"])
    for raw, key in MALFORMED:
        code, answer = team.api().post(path(team), raw=raw)
        assert (code, answer["error"]["key"]) == (400, key), (raw[:40], answer)
    assert still_held(run)


@pytest.mark.django_db
def test_a_huge_body_is_refused(team: Team) -> None:
    code, answer = team.api().post(path(team), raw='{"agent": "' + "x" * (1024 * 1024 + 10) + '"}')
    assert code == 413 and answer["error"]["key"] == "payload_too_large"


# ---- exactly once, with a second operator racing ----


@pytest.mark.spec("S14", "S15")
@pytest.mark.usefixtures("committed", "no_dispatch")
def test_fifty_holds_bulk_retried_while_a_second_operator_retries_some_are_each_retried_once() -> None:
    team = Team()
    second = states_second_operator(team)
    states.agent("racer", team.workspace)
    runs = [held(team.workspace, team.users["operator"], agent="racer") for _ in range(50)]
    contested = runs[::3]  # 17 runs the second operator clicks retry on, one by one, while the bulk runs
    barrier = threading.Barrier(2)
    bulk_answer: dict[str, Any] = {}
    clicks: list[int] = []

    def bulk() -> None:
        try:
            barrier.wait()
            bulk_answer.update(team.api().post(path(team), {"agent": "racer"})[1])
        finally:
            connection.close()

    def clicker() -> None:
        try:
            client = Client()
            client.force_login(second)
            barrier.wait()
            for run in reversed(contested):  # from the other end, so the two meet in the middle
                clicks.append(client.post(f"/runs/{run.pk}/tasks/t0/retry/", HTTP_HX_REQUEST="true").status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=bulk), threading.Thread(target=clicker)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert clicks == [200] * len(contested)  # a click that lost the race is news in a toast, never an error
    results = {r["run"]: r for r in bulk_answer["results"]}
    assert set(results) <= {str(run.pk) for run in runs}
    for run in runs:
        assert verb_events(run, "retry") == {"t0": 1}, f"run {run.pk} retried other than once"
        assert Task.objects.get(run=run, key="t0").failure_resolution == "retried"
    by_second = {str(e.run_id) for e in TraceEvent.objects.filter(run__in=runs, event="verb", actor=second.username)}
    by_bulk = {run for run, r in results.items() if r["outcome"] == "retried"}
    assert by_second and by_bulk, "both operators repaired some runs: the two met"
    assert by_bulk.isdisjoint(by_second) and by_bulk | by_second == {str(run.pk) for run in runs}
    for run, result in results.items():
        if result["outcome"] == "skipped":
            assert run in by_second and result["reason"] in ("not_held", "not_a_candidate"), result
    assert bulk_answer["count"] == len(by_bulk)


def states_second_operator(team: Team) -> Any:
    from tests.factories import make_member

    return make_member(workspace=team.workspace, role="operator")
