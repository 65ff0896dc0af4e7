"""Retention: finished runs' trace (their audit rows with it) and findings older than the
workspace's retention are pruned in bounded batches; open runs' rows and newer rows stay."""

from __future__ import annotations

import io
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from runs import retention
from runs.models import Finding, Run, TraceEvent
from tenancy.models import Workspace
from tests.factories import make_workspace

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 6, 1, 12, tzinfo=UTC)


def run_in(workspace: Workspace, status: str = "completed") -> Run:
    return Run.objects.create(workspace=workspace, status=status)


def events(run: Run, *, days_ago: float, count: int = 1, event: str = "status") -> list[int]:
    """`count` trace events of `run`, written `days_ago` days before NOW (ids rise with time)."""
    first = TraceEvent.objects.filter(run=run).count() + 1
    made = TraceEvent.objects.bulk_create(
        [TraceEvent(run=run, seq=first + n, event=event, actor="someone") for n in range(count)]
    )
    ids = [e.pk for e in made]
    TraceEvent.objects.filter(pk__in=ids).update(at=NOW - timedelta(days=days_ago))
    return ids


def finding(run: Run, *, days_ago: float) -> Finding:
    return Finding.objects.create(
        run_id=run.pk, workspace_id=run.workspace_id, kind="timeout", created_at=NOW - timedelta(days=days_ago)
    )


def kept(ids: list[int]) -> int:
    return TraceEvent.objects.filter(pk__in=ids).count()


def workspace_keeping(days: int | None) -> Workspace:
    workspace = make_workspace()
    workspace.retention_days = days
    workspace.save(update_fields=["retention_days"])
    return workspace


def test_it_prunes_a_finished_runs_old_trace_and_audit_rows_and_keeps_the_newer_ones() -> None:
    workspace = workspace_keeping(30)
    run = run_in(workspace)
    old = events(run, days_ago=40, count=3) + events(run, days_ago=31, event="verb")
    new = events(run, days_ago=29, count=2, event="verb")
    pruned = retention.prune(now=NOW)
    assert kept(old) == 0
    assert kept(new) == 2
    assert pruned.trace == 4


def test_it_keeps_the_whole_trace_of_a_run_still_open() -> None:
    workspace = workspace_keeping(30)
    held = [run_in(workspace, status) for status in ("needs_attention", "running", "paused", "pending", "canceling")]
    ids = [i for run in held for i in events(run, days_ago=400, count=2)]
    retention.prune(now=NOW)
    assert kept(ids) == len(ids)


def test_it_prunes_old_findings_but_not_an_open_runs() -> None:
    workspace = workspace_keeping(30)
    done, held = run_in(workspace), run_in(workspace, "needs_attention")
    old, new, open_old = finding(done, days_ago=31), finding(done, days_ago=5), finding(held, days_ago=90)
    gone_run_finding = Finding.objects.create(
        run_id=uuid.uuid4(), workspace_id=workspace.pk, kind="timeout", created_at=NOW - timedelta(days=60)
    )
    pruned = retention.prune(now=NOW)
    left = set(Finding.objects.filter(workspace_id=workspace.pk).values_list("pk", flat=True))
    assert left == {new.pk, open_old.pk}
    assert old.pk not in left and gone_run_finding.pk not in left
    assert pruned.findings == 2


def test_each_workspace_keeps_its_own_retention_and_zero_keeps_for_ever() -> None:
    short, long, forever = workspace_keeping(10), workspace_keeping(100), workspace_keeping(0)
    short_ids = events(run_in(short), days_ago=50)
    long_ids = events(run_in(long), days_ago=50)
    forever_ids = events(run_in(forever), days_ago=5000)
    retention.prune(now=NOW)
    assert (kept(short_ids), kept(long_ids), kept(forever_ids)) == (0, 1, 1)


def test_a_workspace_without_its_own_retention_takes_the_installers_default() -> None:
    workspace = workspace_keeping(None)
    ids = events(run_in(workspace), days_ago=20)
    with override_settings(OZ0_RETENTION_DAYS=0):
        retention.prune(now=NOW)
        assert kept(ids) == 1
        assert retention.retention_days(workspace) == 0
    with override_settings(OZ0_RETENTION_DAYS=14):
        retention.prune(now=NOW)
        assert kept(ids) == 0
        assert retention.retention_days(workspace) == 14


def test_no_statement_deletes_more_than_the_batch() -> None:
    workspace = workspace_keeping(30)
    runs = [run_in(workspace) for _ in range(3)]
    ids = [i for run in runs for i in events(run, days_ago=60, count=7)]
    findings = [finding(runs[0], days_ago=60) for _ in range(7)]
    deleted: list[int] = []
    from django.db import connection

    def watch(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        result = execute(sql, params, many, context)
        if "DELETE FROM" in sql.upper():
            deleted.append(context["cursor"].rowcount)
        return result

    with override_settings(OZ0_PRUNE_BATCH=4), connection.execute_wrapper(watch):
        pruned = retention.prune(now=NOW)
    assert kept(ids) == 0 and not Finding.objects.filter(pk__in=[f.pk for f in findings]).exists()
    assert pruned.trace == 21 and pruned.findings == 7
    assert deleted and max(deleted) <= 4
    assert sum(deleted) == 28
    assert pruned.batches == len(deleted)


def test_the_trace_bounds_stop_at_the_newest_event_older_than_the_cutoff() -> None:
    # The bounds read the whole table, whose ids follow time in a real install; rows that tests
    # on committed data left behind are newer than these backdated ones yet have lower ids. They
    # go for this test's transaction only.
    TraceEvent.objects.all().delete()
    run = run_in(make_workspace())
    old = events(run, days_ago=10, count=5)
    events(run, days_ago=1, count=5)
    from django.db import connection

    with connection.cursor() as cursor:
        assert retention.trace_bounds(cursor, NOW - timedelta(days=5)) == (old[0], old[-1])
        assert retention.trace_bounds(cursor, NOW - timedelta(days=20)) is None


def test_the_prune_command_prunes_and_says_what_it_did() -> None:
    workspace = workspace_keeping(30)
    ids = events(run_in(workspace), days_ago=400, count=3)
    out = io.StringIO()
    call_command("prune", "--batch-size", "2", stdout=out)
    assert kept(ids) == 0
    assert "pruned 3 trace events and 0 findings" in out.getvalue()


def test_the_prune_command_refuses_a_batch_of_nothing() -> None:
    with pytest.raises(CommandError, match="batch-size"):
        call_command("prune", "--batch-size", "0", stdout=io.StringIO())
