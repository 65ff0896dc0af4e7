"""The regression-case and eval routes of the JSON API (issue 31 item 5): the role matrix
(outsider 404, viewer and reader read, operator writes), the words by the run's rule, and bad
input refused with a typed 4xx that changes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from evals.models import Eval, RegressionCase
from runs.models import Run
from tests.conftest import Team
from tests.evals.cases import FAILS_ALWAYS, FIXED_BY_V2, drive_eval_runs, failed_run, register_version, scripted_agent

pytestmark = pytest.mark.usefixtures("no_dispatch")


def keep(team: Team, run: Run, role: str = "operator") -> tuple[int, Any]:
    return team.api(role).post(f"/runs/{run.pk}/regression-case")


def test_an_operator_keeps_a_failed_run_once(team: Team) -> None:
    run = failed_run(team, scripted_agent(team), FAILS_ALWAYS)
    status, case = keep(team, run)
    assert status == 201, case
    assert (case["kind"], case["source_run"], case["source_version"], case["replayable"]) == ("not_found", str(run.pk), 1, True)
    assert case["input"] == {"issue": "SECRET-INPUT"} and case["group"] is not None
    again_status, again = keep(team, run)
    assert (again_status, again["id"]) == (200, case["id"])


@pytest.mark.parametrize(("role", "expected"), [("outsider", 404), ("viewer", 403), ("reader", 403)])
def test_only_an_operator_keeps_a_case(team: Team, role: str, expected: int) -> None:
    run = failed_run(team, scripted_agent(team), FAILS_ALWAYS)
    status, body = keep(team, run, role)
    assert status == expected and "error" in body
    assert not RegressionCase.objects.exists()


def test_keeping_a_run_that_did_not_fail_is_a_conflict(team: Team) -> None:
    run = failed_run(team, scripted_agent(team), [{"text": "fine"}])
    status, body = keep(team, run)
    assert (status, body["error"]["key"]) == (409, "not_failed")


@pytest.mark.spec("F11", "F12")
@pytest.mark.parametrize(
    ("role", "status", "words"), [("outsider", 404, None), ("viewer", 200, False), ("reader", 200, True), ("operator", 200, True)]
)
def test_the_list_shows_kinds_to_every_member_and_words_to_readers(
    team: Team, role: str, status: int, words: bool | None
) -> None:
    keep(team, failed_run(team, scripted_agent(team), FAILS_ALWAYS))
    got, page = team.api(role).get(f"/workspaces/{team.slug}/regression-cases")
    assert got == status
    if words is None:
        assert page["error"]["key"] == "not_found"
        return
    (case,) = page["items"]
    assert case["kind"] == "not_found" and case["content_visible"] is words
    text = str(page)
    assert ("SECRET" in text) is words


@pytest.mark.parametrize(("role", "expected"), [("outsider", 404), ("viewer", 403), ("reader", 403), ("operator", 204)])
def test_only_an_operator_deletes_a_case(team: Team, role: str, expected: int) -> None:
    _, case = keep(team, failed_run(team, scripted_agent(team), FAILS_ALWAYS))
    status, _ = team.api(role).call("DELETE", f"/workspaces/{team.slug}/regression-cases/{case['id']}")
    assert status == expected
    assert RegressionCase.objects.filter(pk=case["id"]).exists() is (expected != 204)


def test_an_eval_through_the_api_with_one_case_fixed(team: Team) -> None:
    agent = scripted_agent(team)
    fixed, still = failed_run(team, agent, FIXED_BY_V2), failed_run(team, agent, FAILS_ALWAYS)
    keep(team, fixed), keep(team, still)
    register_version(team, agent, "oz.fail, test.echo")
    status, started = team.api().post(f"/workspaces/{team.slug}/evals", {"agent": agent, "version": 2})
    assert status == 201, started
    assert started["counts"]["pending"] == 2 and started["finished_at"] is None
    drive_eval_runs(Eval.objects.get(pk=started["id"]))
    for role in ("viewer", "reader", "operator"):
        status, doc = team.api(role).get(f"/workspaces/{team.slug}/evals/{started['id']}")
        assert status == 200
        assert sorted((r["kind_before"], r["kind_after"], r["passed"]) for r in doc["results"]) == [
            ("model", None, True),
            ("not_found", "not_found", False),
        ]
        assert "SECRET" not in str(doc)
    status, _ = team.api("outsider").get(f"/workspaces/{team.slug}/evals/{started['id']}")
    assert status == 404


@pytest.mark.parametrize(("role", "expected"), [("outsider", 404), ("viewer", 403), ("reader", 403)])
def test_only_an_operator_starts_an_eval(team: Team, role: str, expected: int) -> None:
    agent = scripted_agent(team)
    keep(team, failed_run(team, agent, FAILS_ALWAYS))
    status, _ = team.api(role).post(f"/workspaces/{team.slug}/evals", {"agent": agent, "version": 1})
    assert status == expected
    assert not Eval.objects.exists() and not Run.objects.filter(rollout="eval").exists()


NESTED: Any = {"a": 1}
for _ in range(200):
    NESTED = {"a": NESTED}


@pytest.mark.parametrize(
    ("body", "status", "key"),
    [
        ({"agent": "x"}, 400, "invalid_version"),
        ({"version": 1}, 400, "invalid_agent"),
        ({"agent": "x", "version": "1"}, 400, "invalid_version"),
        ({"agent": "x", "version": 2**40}, 400, "invalid_version"),
        ({"agent": "x", "version": -1}, 400, "invalid_version"),
        ({"agent": "../../etc", "version": 1}, 400, "invalid_agent"),
        ({"agent": "x" * 101, "version": 1}, 400, "invalid_agent"),
        ({"agent": {"$ne": 1}, "version": 1}, 400, "invalid_agent"),
        ({"agent": "x", "version": 1, "nested": NESTED}, 400, None),
        ([1, 2], 400, "invalid_request"),
        ({"agent": "nobody", "version": 1}, 404, "not_found"),
    ],
)
def test_a_bad_eval_body_is_a_typed_4xx_and_starts_nothing(team: Team, body: Any, status: int, key: str | None) -> None:
    got, answer = team.api().post(f"/workspaces/{team.slug}/evals", body)
    assert got == status, answer
    if key is not None:
        assert answer["error"]["key"] == key
    assert not Eval.objects.exists()


@pytest.mark.parametrize("raw", ["{", "\x00", '{"agent": "x", "version": 1e999}', "[" * 5000, "x" * 200_000])
def test_a_malformed_or_huge_eval_body_is_a_typed_4xx(team: Team, raw: str) -> None:
    got, answer = team.api().post(f"/workspaces/{team.slug}/evals", raw=raw)
    assert 400 <= got < 500 and "error" in answer, (got, answer)
    assert not Eval.objects.exists()


@pytest.mark.parametrize("run_id", ["not-a-uuid", "0", "7d1c1d62-4a55-4a8e-9b7e-3c9a1f0e2b11", "%00", "1'%20OR%20'1'='1"])
def test_a_malformed_or_unknown_run_id_is_a_typed_4xx(team: Team, run_id: str) -> None:
    status, answer = team.api().post(f"/runs/{run_id}/regression-case")
    assert status in (400, 404) and "error" in answer, answer
    assert not RegressionCase.objects.exists()


@pytest.mark.parametrize("case_id", ["0", "-1", str(2**70), "abc", "1.5"])
def test_a_malformed_or_unknown_case_or_eval_id_is_a_typed_4xx(team: Team, case_id: str) -> None:
    _, case = keep(team, failed_run(team, scripted_agent(team), FAILS_ALWAYS))
    status, answer = team.api().call("DELETE", f"/workspaces/{team.slug}/regression-cases/{case_id}")
    assert status in (400, 404, 422) and "error" in answer, (status, answer)
    status, answer = team.api().get(f"/workspaces/{team.slug}/evals/{case_id}")
    assert status in (400, 404, 422) and "error" in answer, (status, answer)
    assert RegressionCase.objects.filter(pk=case["id"]).exists()


def test_the_openapi_document_describes_the_routes(team: Team) -> None:
    status, document = team.api().get("/openapi.json")
    assert status == 200
    paths = document["paths"]
    assert set(paths["/api/v1/runs/{run_id}/regression-case"]) == {"post"}
    assert set(paths["/api/v1/workspaces/{ws}/regression-cases"]) == {"get"}
    assert set(paths["/api/v1/workspaces/{ws}/regression-cases/{case_id}"]) == {"delete"}
    assert set(paths["/api/v1/workspaces/{ws}/evals"]) == {"post"}
    assert set(paths["/api/v1/workspaces/{ws}/evals/{eval_id}"]) == {"get"}
    body = paths["/api/v1/workspaces/{ws}/evals"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["required"] == ["agent", "version"] and body["additionalProperties"] is False
