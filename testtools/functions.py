"""What the `test.*` tools do (API.md), run by the worker like any tool (runs.worker.tool_functions)."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from runs.models import Run
from runs.worker.reporting import with_database
from runs.worker.tool_functions import ToolContext, ToolError, ToolFn
from testtools.models import EffectRecord, FlakyCounter

log = logging.getLogger(__name__)


def _echo(args: dict[str, Any], context: ToolContext) -> Any:
    return args.get("value")


def _fail(args: dict[str, Any], context: ToolContext) -> Any:
    raise ToolError(str(args.get("error") or "tool_failed"), str(args.get("detail") or ""))


def _seconds(args: dict[str, Any]) -> float:
    """A test tool's `seconds`, at most OZ0_TEST_SLEEP_MAX: a worker slot is shared by every workspace."""
    raw = args.get("seconds") or 0
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise ToolError("tool_failed", "`seconds` must be a number")
    try:
        seconds = float(raw)
    except ValueError:
        raise ToolError("tool_failed", "`seconds` must be a number") from None
    cap = float(settings.OZ0_TEST_SLEEP_MAX)
    if not 0 <= seconds <= cap:
        raise ToolError("tool_failed", f"`seconds` must be from 0 to {cap:g} (OZ0_TEST_SLEEP_MAX)")
    return seconds


def _sleep(args: dict[str, Any], context: ToolContext) -> Any:
    context.sleep(_seconds(args))
    return args.get("seconds")


def _flaky(args: dict[str, Any], context: ToolContext) -> Any:
    flaky_id = str(args.get("id") or f"{context.run_id}:{context.task_key}")
    with transaction.atomic():
        counter, _ = FlakyCounter.objects.select_for_update().get_or_create(flaky_id=flaky_id)
        FlakyCounter.objects.filter(pk=counter.pk).update(attempts=F("attempts") + 1)
        seen = counter.attempts + 1
    if seen <= int(args.get("fail_times") or 0):
        raise ToolError("tool_failed", f"flaky failure {seen} of {args.get('fail_times')}")
    return {"attempts": seen}


def _effect(replayable: bool) -> ToolFn:
    def run(args: dict[str, Any], context: ToolContext) -> Any:
        seconds = _seconds(args)
        effect_id = str(args.get("id"))
        # The ledger is this tool's world, and it shares oz0's database: an outage of it mid-write
        # leaves the write unanswered, not undone or done. As a careful client of any world does,
        # the tool waits for the world and asks it, by the execution's own key, what became of the
        # write, so an effect is recorded once and a call that did its work is not left in doubt.
        record = with_database(lambda: _record(effect_id, replayable, context), f"the effect ledger's {effect_id}")
        # Optional: stay in the call a while after the effect, so a test can kill the worker mid-call.
        try:
            context.sleep(seconds)
        finally:
            _ended(record)
        return {"id": args.get("id")}

    return run


def _record(effect_id: str, replayable: bool, context: ToolContext) -> EffectRecord:
    """The execution's record: written now, or found, when an earlier try's write went through."""
    if context.execution:
        found = EffectRecord.objects.filter(execution=context.execution).first()
        if found is not None:
            return found
    workspace_id = Run.objects.filter(pk=context.run_id).values_list("workspace_id", flat=True).first()
    # The effect commits at once, as a real write to the world would.
    return EffectRecord.objects.create(
        effect_id=effect_id, replayable=replayable, workspace_id=workspace_id, execution=context.execution or None
    )


def _ended(record: EffectRecord) -> None:
    """Stamp when an execution's stay ended (a dead worker never does), best effort: the ledger
    is the test tools' bookkeeping, never a reason for the call to fail."""
    try:
        EffectRecord.objects.filter(pk=record.pk).update(finished_at=timezone.now())
    except Exception:
        log.warning("the effect ledger could not stamp the end of %s", record.effect_id)


FUNCTIONS: dict[str, ToolFn] = {
    "test.echo": _echo,
    "test.fail": _fail,
    "test.sleep": _sleep,
    "test.flaky": _flaky,
    "test.effect": _effect(False),
    "test.effect_replayable": _effect(True),
}
