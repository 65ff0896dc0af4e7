"""Failure groups (issue 31): failures of the same kind, agent, error key and message shape form a
group with counts, versions, first and last seen and example runs; an operator marks one resolved
in a version, and a later version's failure flags it; a viewer sees kinds and counts, never words."""

from __future__ import annotations

import importlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine
from django.db import connection
from django.test import Client

from insights.models import FailureGroup, FailureGroupVersion
from insights.selectors import scorecard
from runs.fingerprints import failure_fingerprint
from runs.models import Finding, Run
from runs.selectors import encode_cursor
from tests.conftest import Team
from tests.insights.conftest import nothing_sent, oz_fail_round, team_of
from tests.insights.planting import make_agent
from tests.insights.test_scorecard import add_version

pytestmark = pytest.mark.django_db

DAY1 = datetime(2026, 6, 1, 9, tzinfo=UTC)
MISSING_A = "record 'SECRET-A1' not found after 3 tries"
MISSING_B = "record 'SECRET-ZZ9' not found after 17 tries"
DOWN = "the tracker SECRET7 is down"


def fail(team: Any, agent: str, message: str, *, private: bool = False) -> Run:
    status, doc = team.api("operator").post(
        f"/workspaces/{team.slug}/runs",
        {"agent": agent, "tasks": [oz_fail_round("not_found", message)], "deliverable": "r1", "private": private},
    )
    assert status == 201, doc
    from tests.runs.driver import drive

    return drive(Run.objects.get(pk=doc["run"]["id"]))


team = team_of("groups")


@pytest.fixture(scope="module")
def grouped(shared_team: Team, module_transaction: Any) -> dict[str, Any]:
    """v1: two 'record not found' failures on day 1 and a 'tracker down'; v2: one more 'record not found'.
    Built once for the module's tests that read it (each leaves it as it found it)."""
    team = shared_team
    with module_transaction.unblock(), nothing_sent():
        make_agent("grouped", workspace=team.workspace, kinds=("not_found",))
        with time_machine.travel(DAY1, tick=False):
            first = fail(team, "grouped", MISSING_A)
            fail(team, "grouped", DOWN)
        with time_machine.travel(DAY1 + timedelta(hours=1), tick=False):
            fail(team, "grouped", MISSING_B)
        add_version("grouped", 2)
        with time_machine.travel(DAY1 + timedelta(days=1), tick=False):
            last = fail(team, "grouped", MISSING_A.replace("3", "4"))
        missing = FailureGroup.objects.get(fingerprint=Finding.objects.get(run_id=first.pk).fingerprint)
        down = FailureGroup.objects.exclude(pk=missing.pk).get(agent_name="grouped")
    return {"missing": missing.pk, "down": down.pk, "first": first.pk, "last": last.pk}


@pytest.fixture
def groups(grouped: dict[str, Any], db: Any) -> dict[str, Any]:
    """The module's groups and runs, read afresh for each test."""
    return {
        "missing": FailureGroup.objects.get(pk=grouped["missing"]),
        "down": FailureGroup.objects.get(pk=grouped["down"]),
        "first": Run.objects.get(pk=grouped["first"]),
        "last": Run.objects.get(pk=grouped["last"]),
    }


@pytest.mark.spec("F18")
def test_it_groups_failures_whose_messages_differ_only_in_numbers_ids_and_quoted_values(groups: dict[str, Any]) -> None:
    missing, down = groups["missing"], groups["down"]
    assert (missing.kind, missing.agent_name, missing.failed, missing.first_version, missing.last_version) == (
        "not_found",
        "grouped",
        3,
        1,
        2,
    )
    assert (missing.first_seen, missing.last_seen) == (DAY1, DAY1 + timedelta(days=1))
    assert down.failed == 1
    versions = dict(FailureGroupVersion.objects.filter(fingerprint=missing.fingerprint).values_list("agent_version", "failed"))
    assert versions == {1: 2, 2: 1}
    # The rollup agrees with the findings it counts.
    assert Finding.objects.filter(fingerprint=missing.fingerprint).count() == 3


@pytest.mark.spec("F18")
def test_it_stamps_each_finding_with_the_fingerprint_of_its_kind_agent_error_key_and_shape(groups: dict[str, Any]) -> None:
    row = Finding.objects.get(run_id=groups["first"].pk)
    assert row.fingerprint == failure_fingerprint(
        kind="not_found", agent="grouped", error_key=row.error_key, message="record 'x' not found after 99 tries"
    )


@pytest.mark.spec("F11", "F12", "F18")
@pytest.mark.parametrize(("role", "sees_words"), [("viewer", False), ("reader", True), ("operator", True)])
def test_a_group_shows_its_shape_only_to_who_may_read_its_runs(
    team: Any, groups: dict[str, Any], role: str, sees_words: bool
) -> None:
    status, doc = team.api(role).get(f"/insights/groups/{groups['missing'].pk}")
    assert status == 200, doc
    assert (doc["kind"], doc["failed"], doc["runs"], doc["workspace"]) == ("not_found", 3, 3, team.slug)
    assert [v["version"] for v in doc["versions"]] == [2, 1]
    assert doc["examples"][0]["run"] == str(groups["last"].pk) and len(doc["examples"]) == 3
    assert doc["shape"] == ("record '…' not found after <n> tries" if sees_words else None)
    assert "SECRET" not in json.dumps(doc)  # quoted values are masked even for readers


@pytest.mark.spec("F11", "F18")
def test_a_reader_sees_no_shape_of_a_group_whose_runs_are_someone_elses_private_runs(team: Any) -> None:
    make_agent("hush", workspace=team.workspace, kinds=("not_found",))
    run = fail(team, "hush", "private words about SECRET77", private=True)
    group = FailureGroup.objects.get(fingerprint=Finding.objects.get(run_id=run.pk).fingerprint)
    assert team.api("reader").get(f"/insights/groups/{group.pk}")[1]["shape"] is None
    assert team.api("operator").get(f"/insights/groups/{group.pk}")[1]["shape"] == "private words about <id>"


@pytest.mark.spec("F18")
def test_an_outsider_and_the_anonymous_find_no_group(team: Any, groups: dict[str, Any]) -> None:
    pk = groups["missing"].pk
    assert team.api("outsider").get(f"/insights/groups/{pk}")[0] == 404
    assert team.api("outsider").get("/insights/groups")[1]["items"] == []
    assert Client().get(f"/api/v1/insights/groups/{pk}").status_code == 401
    assert Client().get("/api/v1/insights/groups").status_code == 401
    assert team.api("operator").get("/insights/groups/999999999999")[0] == 404
    assert team.api("operator").get("/insights/groups/0")[0] == 404


@pytest.mark.spec("F18")
def test_it_lists_groups_most_recently_seen_first_by_keyset(team: Any, groups: dict[str, Any]) -> None:
    status, page = team.api("viewer").get("/insights/groups?agent=grouped&limit=1")
    assert status == 200 and [g["id"] for g in page["items"]] == [groups["missing"].pk]
    status, page = team.api("viewer").get(f"/insights/groups?agent=grouped&limit=1&cursor={page['next']}")
    assert status == 200 and [g["id"] for g in page["items"]] == [groups["down"].pk] and page["next"] is None
    assert team.api("viewer").get("/insights/groups?agent=nobody")[1]["items"] == []
    assert team.api("viewer").get(f"/insights/groups?workspace={team.slug}")[0] == 200
    assert team.api("viewer").get("/insights/groups?workspace=not-mine")[0] == 404


@pytest.mark.spec("F18")
@pytest.mark.parametrize(
    "cursor",
    [
        "garbage!",
        encode_cursor(["2026-01-01T00:00:00+00:00"]),
        encode_cursor(["not a time", 1]),
        encode_cursor(["2026-01-01T00:00:00+00:00", "1"]),
        encode_cursor(["2026-01-01T00:00:00+00:00", True]),
        encode_cursor(["2026-01-01T00:00:00+00:00", 2**63]),
        encode_cursor({"a": 1}),  # type: ignore[arg-type]
    ],
)
def test_it_refuses_a_crafted_cursor_typed(team: Any, groups: dict[str, Any], cursor: str) -> None:
    status, body = team.api("viewer").get(f"/insights/groups?cursor={cursor}")
    assert status == 400 and body["error"]["key"] == "invalid_cursor", body


@pytest.mark.spec("F18")
def test_it_flags_a_group_resolved_in_a_version_that_comes_back_in_a_later_one(team: Any, groups: dict[str, Any]) -> None:
    down = groups["down"]
    status, doc = team.api("operator").post(f"/insights/groups/{down.pk}/resolve", {"version": 1})
    assert status == 200 and doc["resolved_in_version"] == 1 and doc["regressed"] is False
    add_version("grouped", 3)
    fail(team, "grouped", DOWN.replace("7", "8"))  # the same shape, in v3
    status, doc = team.api("viewer").get(f"/insights/groups/{down.pk}")
    assert (doc["failed"], doc["last_version"], doc["regressed"]) == (2, 3, True)
    top = {g["id"]: g for g in scorecard("grouped", workspace_ids=[team.workspace.pk])["groups"]}
    assert top[down.pk]["regressed"] is True and top[down.pk]["resolved_in_version"] == 1
    # Resolved again in the version it came back in; then reopened.
    assert team.api("operator").post(f"/insights/groups/{down.pk}/resolve", {"version": 3})[1]["regressed"] is False
    status, doc = team.api("operator").post(f"/insights/groups/{down.pk}/resolve", {"version": None})
    assert status == 200 and doc["resolved_in_version"] is None and doc["resolved_at"] is None


@pytest.mark.spec("F18")
@pytest.mark.parametrize(("role", "status"), [("viewer", 403), ("reader", 403), ("outsider", 404), ("operator", 200)])
def test_only_an_operator_marks_a_group_resolved(team: Any, groups: dict[str, Any], role: str, status: int) -> None:
    pk = groups["missing"].pk
    got, body = team.api(role).post(f"/insights/groups/{pk}/resolve", {"version": 2})
    assert got == status, body
    assert FailureGroup.objects.get(pk=pk).resolved_in_version == (2 if role == "operator" else None)
    assert Client().post(f"/api/v1/insights/groups/{pk}/resolve", "{}", content_type="application/json").status_code == 401
    assert team.api("operator").get(f"/insights/groups/{pk}/resolve")[0] == 405


@pytest.mark.spec("F18")
@pytest.mark.parametrize(
    "raw",
    ['{"version": 0}', '{"version": -1}', '{"version": "3"}', '{"version": true}', '{"version": 2.5}', "{}",
     '{"version": 1, "extra": 1}', '{"version": 99999999999}', "[1]", "not json", '{"version": 1e3}'],
)  # fmt: skip
def test_it_refuses_a_bad_version_typed(team: Any, groups: dict[str, Any], raw: str) -> None:
    status, body = team.api("operator").post(f"/insights/groups/{groups['missing'].pk}/resolve", raw=raw)
    assert 400 <= status < 500 and status != 404, (status, body)
    assert isinstance(body, dict) and body["error"]["key"], body
    assert FailureGroup.objects.get(pk=groups["missing"].pk).resolved_in_version is None


@pytest.mark.spec("F18")
def test_the_scorecard_lists_its_top_groups_commonest_first(team: Any, groups: dict[str, Any]) -> None:
    card = scorecard("grouped", workspace_ids=[team.workspace.pk])
    assert [(g["id"], g["failed"]) for g in card["groups"]] == [(groups["missing"].pk, 3), (groups["down"].pk, 1)]
    assert "shape" not in card["groups"][0]  # words never ride on a scorecard
    one = scorecard("grouped", version=2, workspace_ids=[team.workspace.pk])
    assert [(g["id"], g["failed"]) for g in one["groups"]] == [(groups["missing"].pk, 1)]
    late = scorecard("grouped", since=DAY1 + timedelta(days=1), workspace_ids=[team.workspace.pk])
    assert [g["id"] for g in late["groups"]] == [groups["missing"].pk]
    status, doc = team.api("viewer").get("/insights/agents/grouped")
    assert status == 200 and [g["id"] for g in doc["groups"]] == [groups["missing"].pk, groups["down"].pk]


@pytest.mark.spec("F18")
def test_the_backfill_stamps_older_findings_in_batches_as_the_kernel_would(team: Any, groups: dict[str, Any]) -> None:
    backfill = importlib.import_module("runs.migrations.0020_finding_fingerprint_backfill")
    # This workspace's findings only: rows that tests on committed data left were stamped by
    # whatever planted them, not always as the kernel would.
    ours = Finding.objects.filter(workspace_id=team.workspace.pk)
    expected = dict(ours.values_list("pk", "fingerprint"))
    ours.update(fingerprint="")
    gone = Finding.objects.create(
        run_id="00000000-0000-0000-0000-00000000dead",
        workspace_id=team.workspace.pk,
        agent_name="grouped",
        kind="timeout",
        created_at=DAY1,
    )

    class Editor:
        pass

    editor = Editor()
    editor.connection = connection  # type: ignore[attr-defined]
    backfill.BATCH = 2
    try:
        backfill.stamp(None, editor)
    finally:
        backfill.BATCH = 5000
    stamped = dict(Finding.objects.values_list("pk", "fingerprint"))
    assert {pk: stamped[pk] for pk in expected} == expected
    # A finding whose run is gone groups by kind, agent and error key alone.
    assert stamped[gone.pk] == failure_fingerprint(kind="timeout", agent="grouped", error_key="", message=None)
