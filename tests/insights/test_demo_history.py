"""`./oz0 demo` loads weeks of labelled history through the kernel, so scorecards read non-zero."""

from __future__ import annotations

from datetime import UTC, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from insights import overview
from insights.models import FailureDaily, RunDaily
from insights.selectors import scorecard
from runs.management.commands.demo import HISTORY_DAYS
from runs.models import Finding, Run
from tenancy.models import Workspace

pytestmark = pytest.mark.django_db


@pytest.mark.thorough
@pytest.mark.spec("F18")
def test_the_demo_history_makes_scorecards_that_are_not_zero(no_dispatch: list[int]) -> None:
    out = StringIO()
    call_command("demo", stdout=out)
    assert "history:" in out.getvalue()
    workspace = Workspace.objects.get(slug="demo")
    history = Run.objects.filter(workspace=workspace, input__demo="history")
    assert history.count() > 50
    assert all("demo history" in run.input["note"] for run in history)

    # The kernel settled every run (none left running), and wrote the findings the rollups count.
    statuses = set(history.values_list("status", flat=True))
    assert statuses <= {"completed", "failed", "canceled", "needs_attention"} and "completed" in statuses
    failed_runs = history.exclude(status="completed").count()
    findings = Finding.objects.filter(run_id__in=history.values("id"))
    assert findings.count() == failed_runs > 0

    # Spread over the past weeks, consistently: a run's findings are from its own day.
    today = timezone.now().astimezone(UTC).date()
    days = {run.created_at.astimezone(UTC).date() for run in history}
    assert min(days) == today - timedelta(days=HISTORY_DAYS) and len(days) >= HISTORY_DAYS - 1
    created = dict(history.values_list("id", "created_at"))
    for finding in findings:
        assert finding.created_at.astimezone(UTC).date() == created[finding.run_id].astimezone(UTC).date()

    card = scorecard("history-invoices", workspace_ids=[workspace.pk])
    assert card["runs"] > 0 and card["failed"] > 0 and [v["version"] for v in card["versions"]] == [3, 2, 1]
    v3, v2, v1 = card["versions"]
    assert v1["rate"] > v2["rate"] > v3["rate"]  # each version fails less: what the page is for
    assert card["repairs"]["abandoned"] > 0 and card["repairs"]["hold_to_repair_mean_seconds"] > 3600  # a day later
    router = scorecard("history-router", workspace_ids=[workspace.pk])
    assert router["versions"][0]["rate"] > router["versions"][1]["rate"]  # a regression
    assert RunDaily.objects.filter(workspace_id=workspace.pk, agent_name="history-router").count() >= HISTORY_DAYS - 1
    assert FailureDaily.objects.filter(workspace_id=workspace.pk, day__lt=today - timedelta(days=7)).exists()
    agents = {a["name"]: a for a in overview.agents_overview(workspace)}
    assert agents["history-invoices"]["change"] is not None and agents["history-router"]["change"] > 0

    # Idempotent: a second load adds nothing.
    count = Run.objects.filter(workspace=workspace).count()
    again = StringIO()
    call_command("demo", stdout=again)
    assert "history already loaded" in again.getvalue()
    assert Run.objects.filter(workspace=workspace).count() == count
