"""F18: an agent's scorecard counts failed runs by kind, in all and per version, with rates,
the trend per day and repairs; the rollups the triggers keep agree with the findings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
import time_machine
from django.core.management import CommandError, call_command
from django.db.models import Sum

from insights.models import FailureDaily, FailureTotal, RepairDaily, RepairTotal, RunDaily, RunTotal
from insights.selectors import scorecard
from oz0agents.models import AgentVersion
from runs.models import Finding
from tests.conftest import Team
from tests.factories import make_workspace
from tests.insights.conftest import answering_round, nothing_sent, oz_fail_round, run_agent, team_of
from tests.insights.planting import make_agent
from tests.runs.driver import drive

pytestmark = pytest.mark.django_db

DAY1 = datetime(2026, 6, 1, 9, tzinfo=UTC)


def by_kind(rows: list[dict[str, Any]]) -> dict[str, int]:
    return {row["kind"]: row["failed"] for row in rows}


def add_version(agent: str, version: int) -> None:
    latest = AgentVersion.objects.filter(agent__name=agent).order_by("-version").first()
    assert latest is not None
    AgentVersion.objects.create(
        agent=latest.agent, version=version, manifest_text=latest.manifest_text, manifest=latest.manifest, digest=f"v{version}"
    )


def cancel(team: Any, agent: str) -> None:
    status, doc = team.api("operator").post(
        f"/workspaces/{team.slug}/runs", {"agent": agent, "tasks": [{"key": "a", "kind": "await", "question": "?"}]}
    )
    assert status == 201
    status, doc = team.api("operator").post(f"/runs/{doc['run']['id']}/cancel", {"reason": "no longer needed"})
    assert status == 200 and doc["run"]["status"] == "canceled"


team = team_of("history")


@pytest.fixture(scope="module")
def history(shared_team: Team, module_transaction: Any) -> str:
    """triage: v1 ran 3 times on day 1 (2 not_found); v2 ran 3 times on day 2 (1 not_found, 1 cancelled).
    Built once for the module's tests that read it (each leaves it as it found it)."""
    team = shared_team
    with module_transaction.unblock(), nothing_sent():
        make_agent("triage-card", workspace=team.workspace, kinds=("not_found", "tracker_busy"))
        with time_machine.travel(DAY1, tick=False):
            run_agent(team, "triage-card", oz_fail_round("not_found"))
            run_agent(team, "triage-card", oz_fail_round("not_found"))
            run_agent(team, "triage-card", answering_round())
        add_version("triage-card", 2)
        with time_machine.travel(DAY1 + timedelta(days=1), tick=False):
            run_agent(team, "triage-card", oz_fail_round("not_found"))
            run_agent(team, "triage-card", answering_round())
            cancel(team, "triage-card")
    return "triage-card"


@pytest.mark.spec("F18")
def test_it_counts_failed_runs_by_kind_in_all_and_per_version(team: Any, history: str) -> None:
    status, card = team.api("viewer").get(f"/insights/agents/{history}")
    assert status == 200, card
    assert (card["runs"], card["failed"], card["rate"]) == (6, 4, round(4 / 6, 4))
    assert by_kind(card["by_kind"]) == {"not_found": 3, "cancelled": 1}
    not_found = next(row for row in card["by_kind"] if row["kind"] == "not_found")
    assert not_found["declared"] is True and not_found["person"] is True and not_found["rate"] == 0.5
    cancelled = next(row for row in card["by_kind"] if row["kind"] == "cancelled")
    assert (cancelled["declared"], cancelled["retryable"], cancelled["partial"]) == (False, False, True)
    versions = {v["version"]: v for v in card["versions"]}
    assert (versions[1]["runs"], versions[1]["failed"], by_kind(versions[1]["by_kind"])) == (3, 2, {"not_found": 2})
    assert (versions[2]["runs"], versions[2]["failed"], by_kind(versions[2]["by_kind"])) == (
        3,
        2,
        {"not_found": 1, "cancelled": 1},
    )
    status, only = team.api("viewer").get(f"/insights/agents/{history}?version=2")
    assert (only["runs"], only["failed"], [v["version"] for v in only["versions"]]) == (3, 2, [2])


@pytest.mark.spec("F18")
def test_it_shows_the_trend_per_day_and_honours_since_and_until(team: Any, history: str) -> None:
    status, card = team.api("viewer").get(f"/insights/agents/{history}?since=2026-06-01&until=2026-06-02")
    assert status == 200
    assert [(d["day"], d["runs"], d["failed"], d["by_kind"]) for d in card["trend"]] == [
        ("2026-06-01", 3, 2, {"not_found": 2}),
        ("2026-06-02", 3, 2, {"cancelled": 1, "not_found": 1}),
    ]
    status, card = team.api("viewer").get(f"/insights/agents/{history}?since=2026-06-02")
    assert (card["runs"], card["failed"]) == (3, 2)
    status, card = team.api("viewer").get(f"/insights/agents/{history}?until=2026-06-01")
    assert (card["runs"], card["failed"]) == (3, 2)
    assert len(card["trend"]) == 30 and card["trend"][-1]["day"] == "2026-06-01"
    status, body = team.api("viewer").get(f"/insights/agents/{history}?since=soon")
    assert status == 400 and body["error"]["key"] == "invalid_query"


@pytest.mark.spec("F18")
@pytest.mark.parametrize("moment", ["0.5", "0", "1780000000", "2026-06-01T00:00:00", "2026-02-30", "2026-06-01T25:00:00Z"])
def test_a_moment_is_a_date_or_an_rfc3339_datetime(team: Any, history: str, moment: str) -> None:
    """Not a bare number (pydantic's lax reading took 0.5 for seconds since 1970), nor a datetime
    without its offset, nor a day the calendar lacks: the document's formats say so (issue 27.8)."""
    for name in ("since", "until"):
        status, body = team.api("viewer").get(f"/insights/agents/{history}?{name}={moment}")
        assert (status, body["error"]["key"]) == (400, "invalid_query"), body


@pytest.mark.spec("F18")
def test_a_moment_with_its_offset_counts_from_that_instant(team: Any, history: str) -> None:
    status, whole_day = team.api("viewer").get(f"/insights/agents/{history}?since=2026-06-02")
    status, offset = team.api("viewer").get(f"/insights/agents/{history}?since=2026-06-02T02:00:00%2B02:00")
    assert status == 200 and (offset["runs"], offset["failed"]) == (whole_day["runs"], whole_day["failed"]) == (3, 2)


@pytest.mark.spec("F18")
def test_it_counts_repairs_and_the_time_from_hold_to_repair(team: Any) -> None:
    make_agent("repairable", workspace=team.workspace)
    task = {
        "key": "t1",
        "kind": "tool",
        "tool": "test.fail",
        "args": {"error": "tool_failed", "detail": "x"},
        "on_failure": "halt",
    }
    with time_machine.travel(DAY1, tick=False):
        first = run_agent(team, "repairable", task)
        second = run_agent(team, "repairable", task)
    assert first.status == second.status == "needs_attention" and first.held_since == DAY1
    with time_machine.travel(DAY1 + timedelta(minutes=10), tick=False):
        status, doc = team.api("operator").post(f"/runs/{first.pk}/tasks/t1/retry")
        assert status == 200, doc
    with time_machine.travel(DAY1 + timedelta(minutes=30), tick=False):
        status, doc = team.api("operator").post(f"/runs/{second.pk}/tasks/t1/abandon")
        assert status == 200, doc
    status, card = team.api("viewer").get("/insights/agents/repairable")
    repairs = card["repairs"]
    assert (repairs["retried"], repairs["abandoned"], repairs["after_hold"]) == (1, 1, 2)
    assert repairs["hold_to_repair_mean_seconds"] == 1200.0 and repairs["hold_to_repair_max_seconds"] == 1800.0
    assert card["versions"][0]["repairs"]["retried"] == 1
    drive(first)  # the retried call fails again: a second hold, repaired by nobody yet
    status, card = team.api("viewer").get("/insights/agents/repairable")
    assert card["repairs"]["retried"] == 1


@pytest.mark.spec("F18")
def test_it_keeps_rollups_equal_to_the_findings_and_runs(team: Any, history: str) -> None:
    # Scoped to this workspace: committed-data tests on the same xdist worker leave theirs behind.
    ours = {"workspace_id": team.workspace.id}
    assert FailureDaily.objects.filter(**ours).aggregate(n=Sum("failed"))["n"] == Finding.objects.filter(**ours).count() == 4
    assert FailureTotal.objects.filter(**ours).aggregate(n=Sum("failed"))["n"] == 4
    assert RunDaily.objects.filter(agent_name=history, **ours).aggregate(n=Sum("started"))["n"] == 6
    assert RunTotal.objects.filter(agent_name=history, **ours).aggregate(n=Sum("started"))["n"] == 6
    assert not RepairTotal.objects.filter(**ours).exists()


@pytest.mark.spec("F18")
def test_it_counts_only_the_readers_workspaces(team: Any, history: str) -> None:
    other = make_workspace()
    Finding.objects.create(
        run_id="00000000-0000-0000-0000-0000000000aa",
        workspace_id=other.pk,
        agent_name=history,
        agent_version=2,
        kind="tracker_busy",
        created_at=DAY1,
    )
    status, card = team.api("viewer").get(f"/insights/agents/{history}")
    assert "tracker_busy" not in by_kind(card["by_kind"])
    assert "tracker_busy" in by_kind(scorecard(history)["by_kind"])  # the operator's command sees every workspace
    status, body = team.api("outsider").get(f"/insights/agents/{history}")
    assert status == 404
    status, body = team.api("viewer").get("/insights/agents/no-such-agent")
    assert status == 404 and body["error"]["key"] == "not_found"


@pytest.mark.spec("F18")
def test_it_prints_the_scorecard_as_a_table(team: Any, history: str) -> None:
    out = StringIO()
    call_command("insights_agent", history, stdout=out)
    text = out.getvalue()
    assert f"agent {history}: 6 run(s), 4 failed (66.7%)" in text
    assert "failed runs by kind" in text and "per version" in text and "trend per day" in text
    kind_lines = [line.split() for line in text.splitlines() if line.startswith(("not_found", "cancelled"))]
    assert ["not_found", "3", "50.0%", "person", "yes"] in kind_lines
    out = StringIO()
    call_command("insights_agent", history, "--version", "1", "--since", "2026-06-01", stdout=out)
    assert f"agent {history} since 2026-06-01: 3 run(s), 2 failed" in out.getvalue()
    with pytest.raises(CommandError, match="not_found"):
        call_command("insights_agent", "nobody-at-all", stdout=StringIO())


@pytest.mark.spec("F18")
def test_it_backfills_the_same_counts_the_triggers_keep(team: Any, history: str) -> None:
    """The migrations' backfill (rows that existed before the triggers) agrees with the triggers."""
    import importlib

    from django.db import connection

    make_agent("backfilled", workspace=team.workspace)
    task = {
        "key": "t1",
        "kind": "tool",
        "tool": "test.fail",
        "args": {"error": "tool_failed", "detail": "x"},
        "on_failure": "halt",
    }
    held = run_agent(team, "backfilled", task)
    status, doc = team.api("operator").post(f"/runs/{held.pk}/tasks/t1/abandon")
    assert status == 200, doc
    models = (FailureDaily, RunDaily, RepairDaily, FailureTotal, RunTotal, RepairTotal)

    def counts() -> list[Any]:
        return [
            sorted(FailureDaily.objects.values_list("agent_name", "agent_version", "workspace_id", "kind", "day", "failed")),
            sorted(RunDaily.objects.values_list("agent_name", "agent_version", "workspace_id", "day", "started")),
            sorted(
                RepairDaily.objects.values_list("agent_name", "agent_version", "workspace_id", "resolution", "day", "repairs")
            ),
            sorted(FailureTotal.objects.values_list("agent_name", "agent_version", "workspace_id", "kind", "failed")),
            sorted(RunTotal.objects.values_list("agent_name", "agent_version", "workspace_id", "started")),
            sorted(RepairTotal.objects.values_list("agent_name", "agent_version", "workspace_id", "resolution", "repairs")),
        ]

    kept = counts()
    assert kept[2] and kept[5], "the abandon was counted as a repair"
    for model in models:
        model.objects.all().delete()
    with connection.cursor() as cursor:
        cursor.execute(importlib.import_module("insights.migrations.0002_rollup_triggers").BACKFILL)
        cursor.execute(importlib.import_module("insights.migrations.0004_totals_triggers").BACKFILL)
    assert counts() == kept
