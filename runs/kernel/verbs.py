"""The verbs people (and the kernel's own callers) apply to a run: retry, abandon, compact,
approve, deny, answer, resolve an await, cancel, pause, resume. Each loads and locks the run
once, checks the caller's standing, and moves under that one lock.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from runs.kernel.access import actor_name, require_approver, require_content, require_write
from runs.kernel.approvals import call_decision, spec_digest
from runs.kernel.candidates import repair_candidates_of
from runs.kernel.commit import locked
from runs.kernel.compile import check_storable
from runs.kernel.errors import Conflict, InvalidRequest, NotFound
from runs.kernel.expansion import arm_compaction_in, await_token_digest
from runs.kernel.failure import call_replayable, nonreplayable_calls, renewed, renewed_attempts, route_refusal
from runs.kernel.graph import FINISHED_RUN_STATUSES
from runs.kernel.request_shapes import (
    APPROVE_BODY,
    AWAIT_OUTCOME_BODY,
    MAX_PAYLOAD_BYTES,
    REASON_BODY,
    RETRY_BODY,
    check_field,
    is_digest,
    read_fields,
)
from runs.kernel.scheduling import after_failure, evaluate, make_ready, release
from runs.kernel.settling import cancel, pause, release_hold, resume
from runs.kernel.txn import Txn
from runs.models import Run, RunStatus, Task, TaskStatus
from tenancy.approvers import PLATFORM_ACTOR, Owners
from tenancy.permissions import is_member


def _verb_task(txn: Txn, user: Any, key: str) -> Task:
    require_write(user, txn.run.workspace_id)
    if txn.run.status in FINISHED_RUN_STATUSES:
        raise Conflict("run_finished", f"the run is {txn.run.status}; it accepts no verb but reading")
    task = Task.objects.filter(run=txn.run, key=key).first()
    if task is None:
        raise NotFound("task")
    txn.remember([task])
    return task


def _decision_task(txn: Txn, user: Any, key: str) -> Task:
    """A waiting task a person decides on (approve, deny, answer): write standing, and the
    standing to read what is decided (content_hidden otherwise)."""
    task = _verb_task(txn, user, key)
    require_content(user, txn.run)
    return task


def _require_candidate(txn: Txn, task: Task) -> None:
    if txn.run.status == RunStatus.CANCELING:
        raise Conflict("run_canceling", "the run is being canceled")
    if task.key not in repair_candidates_of([txn.run.pk])[txn.run.pk]:
        raise Conflict("not_a_candidate", f"task {task.key!r} is not a retry or abandon candidate (S15, S16)")


def retry(*, run_id: Any, key: str, user: Any, confirm_calls: Any = None) -> Run:
    """Run a failed task again under its own lineage; what its failure skipped comes back.

    A harnessed round that already made non-replayable calls starts its session over, and its agent
    may make them again: the retry is refused (`nonreplayable_calls_made`, the calls listed) unless
    `confirm_calls` names every one of them by its key, so the person knows what may happen twice."""
    check_field(RETRY_BODY, "confirm_calls", confirm_calls)
    with locked(run_id, actor_name(user)) as txn:
        task = _verb_task(txn, user, key)
        _require_candidate(txn, task)
        made: list[dict[str, Any]] = []
        if task.kind in ("round", "summarizer"):
            refusal = route_refusal(task)
            if refusal:
                raise Conflict("model_route_spent", refusal)
            made = nonreplayable_calls(task)
            unconfirmed = [c for c in made if c["key"] not in (confirm_calls or [])]
            if unconfirmed:
                listed = ", ".join(f"{c['key']} ({c['tool']}, {c['status']})" for c in made)
                raise Conflict(
                    "nonreplayable_calls_made",
                    f"{key} already made non-replayable calls its agent may make again when it starts over: {listed}; "
                    "retry with `confirm_calls` naming them to go ahead",
                    extra={"calls": made},
                )
        txn.event(task.key, "verb", data={"verb": "retry", **({"confirmed_calls": [c["key"] for c in made]} if made else {})})
        txn.resolve(task, "retried")
        txn.move(
            task,
            TaskStatus.WAITING,
            ready=False,
            claim=None,
            cancel_requested=False,
            error_key=None,
            error_detail=None,
            finished_at=None,
            state=renewed_attempts(task.state) if task.kind in ("round", "summarizer") else renewed(task.state),
        )
        revived = list(Task.objects.filter(run=txn.run, status=TaskStatus.SKIPPED, skipped_by=task.key))
        if revived:
            revived = [txn.cache.get(t.key, t) for t in revived]
            txn.move_many(revived, TaskStatus.WAITING, skipped_by=None, ready=False, finished_at=None)
        if txn.run.status == RunStatus.NEEDS_ATTENTION:
            release_hold(txn)
        make_ready(txn, task)
        settled = evaluate(txn, revived)
        release(txn, settled)
        return txn.run


def abandon(*, run_id: Any, key: str, user: Any, cancel_run: bool = False) -> Run:
    """Settle a failure as resolved: it no longer holds the run, and its dependents are skipped.

    With `cancel_run`, the run is canceled in the same transaction: the one action for a failure
    the run's deliverable cannot do without, whose abandon alone would leave the run held again
    (deliverable unresolved)."""
    with locked(run_id, actor_name(user)) as txn:
        task = _verb_task(txn, user, key)
        _require_candidate(txn, task)
        txn.event(task.key, "verb", data={"verb": "abandon", **({"cancel_run": True} if cancel_run else {})})
        txn.resolve(task, "abandoned")
        release(txn, [task.key])
        if cancel_run:
            cancel(txn, reason=f"{task.key} abandoned and the run canceled", failure=None, step=None)
        elif txn.run.status == RunStatus.NEEDS_ATTENTION:
            release_hold(txn)
        return txn.run


def compact(*, run_id: Any, key: str, user: Any) -> Run:
    """Repair a round by authoring a summarizer for it (S14, S23)."""
    with locked(run_id, actor_name(user)) as txn:
        task = _verb_task(txn, user, key)
        if task.kind != "round":
            raise Conflict("not_a_candidate", "only a round can be compacted")
        _require_candidate(txn, task)
        txn.event(task.key, "verb", data={"verb": "compact"})
        if not arm_compaction_in(txn, task, {}):
            raise Conflict("not_a_candidate", "the round has no history to summarize")
        if txn.run.status == RunStatus.NEEDS_ATTENTION:
            release_hold(txn)
        return txn.run


def _pending_approval(txn: Txn, user: Any, key: str) -> tuple[Task, Owners]:
    """A call waiting for approval that this person may decide: write standing, its words readable,
    and, when an approver group owns its tool, a member of that group (`not_an_approver`)."""
    task = _decision_task(txn, user, key)
    if task.status != TaskStatus.NEEDS_APPROVAL:
        raise Conflict("not_pending", f"task {key!r} is {task.status}, not waiting for approval")
    return task, require_approver(user, txn.run, task)


def _needs_two(task: Task, owners: Owners, spec: Any, user: Any) -> bool:
    """Whether this call runs only once two different people approved it: a group that owns it
    asks for two approvers and the call is not replayable (it acts on the world once, for real)."""
    return user is not None and owners.two_approvers and not call_replayable(task.kind, spec)


def _first_of_two(txn: Txn, task: Task, user: Any, digest: str, data: dict[str, Any]) -> bool:
    """A two-approver call's approval: the first one is recorded (on the task and in the trace) and
    the call stays pending, True; the second, by someone else, lets it run, False. The same person
    twice is refused (`same_approver`). Approvals count for one digest: a call edited since its
    first approval starts over."""
    given = [a for a in task.state.get("approvals") or [] if a.get("digest") == digest]
    if any(a.get("user") == user.pk for a in given):
        raise Conflict(
            "same_approver", f"you approved {task.key} already: it runs once a second, different approver approves it too"
        )
    if given:
        data.update(approval=2, of=2, first_by=given[0].get("by"))
        return False
    first = {"by": txn.actor, "user": user.pk, "digest": digest, "at": txn.now.isoformat()}
    state = {**task.state, "approvals": [first]}
    if Task.objects.filter(pk=task.pk, status=TaskStatus.NEEDS_APPROVAL).update(state=state) != 1:
        raise Conflict("stale_task", f"task {task.key!r} is no longer needs_approval")
    task.state = state
    txn.event(task.key, "verb", data={**data, "approval": 1, "of": 2})
    return True


def _require_effects_confirmed(task: Task, spec: Any, confirm_effects: bool | None) -> None:
    """A console approval says whether the person confirmed a call with effects (`confirm_effects`
    False: asked and not confirmed). None: the caller asked nobody (the API), as before."""
    if confirm_effects is False and not call_replayable(task.kind, spec):
        tool = spec.get("tool")
        raise Conflict(
            "effects_unconfirmed",
            f"{task.key} calls {tool}, which is not replayable: it has effects and runs once, for real; "
            "confirm that to approve it",
            extra={"tool": tool},
        )


def _require_current(task: Task, digest: Any, current: str) -> None:
    if digest is not None and digest != current:
        raise Conflict("approval_stale", f"the call {task.key!r} changed since you saw it; read its arguments again")


def approve(*, run_id: Any, key: str, user: Any, digest: Any = None, confirm_effects: bool | None = None) -> Run:
    """Approve a waiting call, bound to its digest (tool + args) as it stands under the lock: the
    call runs with exactly those arguments, or passes the stage again. Given the `digest` the
    approver saw, a call that changed since answers `approval_stale` and nothing changes."""
    check_field(APPROVE_BODY, "digest", digest)
    with locked(run_id, actor_name(user)) as txn:
        task, owners = _pending_approval(txn, user, key)
        current = spec_digest(task.spec)
        _require_current(task, digest, current)
        _require_effects_confirmed(task, task.spec, confirm_effects)
        data: dict[str, Any] = {"verb": "approve", "digest": current}
        if _needs_two(task, owners, task.spec, user) and _first_of_two(txn, task, user, current, data):
            return txn.run
        txn.event(task.key, "verb", data=data)
        txn.move(task, TaskStatus.WAITING, ready=False, deadline_at=None, approved_digest=current)
        make_ready(txn, task)
        return txn.run


def edited_call_args(args: Any) -> dict[str, Any]:
    """Arguments a person typed for a call: an object the row store holds, within the payload cap.
    Tools declare no argument schema here; these are the checks a model's own call passes."""
    if not isinstance(args, Mapping):
        raise InvalidRequest("invalid_args", "the edited arguments must be a JSON object, as a tool call's are")
    check_storable(args)
    size = len(json.dumps(args, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))
    if size > MAX_PAYLOAD_BYTES:
        raise InvalidRequest(
            "payload_too_large", f"the edited arguments are {size} bytes; at most {MAX_PAYLOAD_BYTES}", status=413
        )
    return dict(args)


def approve_edited(*, run_id: Any, key: str, user: Any, digest: Any, args: Any, confirm_effects: bool | None = None) -> Run:
    """Edit a waiting call's arguments, then approve it, in one transaction: the task's args and
    its approved digest change with the decision. `digest` is the call the person edited (required:
    an edit of a call that changed since is `approval_stale`). The trace's verb event holds both
    calls (the original args and digest beside the edited ones), and the task's state names the
    editor, so the model reads that its call ran with a person's arguments (`tool_message`).

    Refused, changing nothing: a framework's own tool (`not_editable`: the framework runs it with
    its own arguments), an edit a rule of the run denies (`edit_denied_by_rule`: a denial beats a
    person, edited or not), and an edit that would change whether the call may run again blind
    (`edit_changes_replayability`). Unchanged arguments are a plain approval."""
    if not is_digest(digest):
        raise InvalidRequest("invalid_field", "`digest` must be the 64 lowercase hex characters of the call you edited")
    edited = edited_call_args(args)
    with locked(run_id, actor_name(user)) as txn:
        task, owners = _pending_approval(txn, user, key)
        current = spec_digest(task.spec)
        _require_current(task, digest, current)
        if task.spec.get("native"):
            raise Conflict("not_editable", f"{key} is a framework's own tool: it runs with its own arguments; approve or deny it")
        spec = {**task.spec, "args": edited}
        new_digest = spec_digest(spec)
        if new_digest == current:
            _require_effects_confirmed(task, task.spec, confirm_effects)
            plain: dict[str, Any] = {"verb": "approve", "digest": current}
            if _needs_two(task, owners, task.spec, user) and _first_of_two(txn, task, user, current, plain):
                return txn.run
            txn.event(task.key, "verb", data=plain)
            txn.move(task, TaskStatus.WAITING, ready=False, deadline_at=None, approved_digest=current)
            make_ready(txn, task)
            return txn.run
        if call_replayable(task.kind, spec) != call_replayable(task.kind, task.spec):
            raise Conflict(
                "edit_changes_replayability", "an edit cannot change whether the call may run again blind (`replayable`)"
            )
        _require_effects_confirmed(task, task.spec, confirm_effects)
        tool = str(task.spec.get("tool", ""))
        decision, by = call_decision(txn.run.approval or {}, tool, edited)
        if decision == "deny":
            rule = by.get("rule")
            raise Conflict("edit_denied_by_rule", f"a rule of this run ({rule}) denies {tool} with the edited arguments")
        original = task.spec.get("args")
        data = {
            "verb": "approve",
            "digest": new_digest,
            "edited": True,
            "original_digest": current,
            "original_args": original,
            "args": edited,
        }
        state = {**task.state, "edited_by": txn.actor, "original_args": original}
        if _needs_two(task, owners, spec, user):
            # The edited call is a new call: the editor's approval is its first; a second person
            # approves exactly these arguments (their digest) before it runs.
            first = {"by": txn.actor, "user": user.pk, "digest": new_digest, "at": txn.now.isoformat()}
            state["approvals"] = [first]
            txn.event(task.key, "verb", data={**data, "approval": 1, "of": 2})
            if Task.objects.filter(pk=task.pk, status=TaskStatus.NEEDS_APPROVAL).update(spec=spec, state=state) != 1:
                raise Conflict("stale_task", f"task {key!r} is no longer needs_approval")
            task.spec, task.state = spec, state
            return txn.run
        txn.event(task.key, "verb", data=data)
        txn.move(task, TaskStatus.WAITING, ready=False, deadline_at=None, approved_digest=new_digest, spec=spec, state=state)
        make_ready(txn, task)
        return txn.run


def deny(*, run_id: Any, key: str, user: Any, reason: str) -> Run:
    check_field(REASON_BODY, "reason", reason)
    with locked(run_id, actor_name(user)) as txn:
        task, _ = _pending_approval(txn, user, key)
        # The reason is the approver's words: the trace shows it only to content readers (not structural).
        txn.event(task.key, "verb", data={"verb": "deny", "message": reason or None})
        # The model reads a denied call in the approver's words, not the tool's (F14).
        state = {**task.state, "denied_by": txn.actor}
        txn.move(
            task,
            TaskStatus.FAILED,
            error=("approval_denied", reason or "denied"),
            finished_at=txn.now,
            deadline_at=None,
            state=state,
        )
        after_failure(txn, task)
        return txn.run


def answer(*, run_id: Any, key: str, user: Any, value: Any) -> Run:
    """Answer a model's question (a tokenless await in awaiting_input)."""
    check_storable(value)
    with locked(run_id, actor_name(user)) as txn:
        task = _decision_task(txn, user, key)
        if task.status != TaskStatus.AWAITING_INPUT:
            raise Conflict("not_pending", f"task {key!r} is {task.status}, not awaiting input")
        txn.event(task.key, "verb", data={"verb": "answer", "value": value})
        txn.complete([(task, value)], result={}, finished_at=txn.now, deadline_at=None)
        release(txn, [task.key])
        return txn.run


def resolve_await(*, token: Any, user: Any, value: Any, error: Any = None) -> Run:
    """Resolve a client-authored await with its bearer proof (S8): with its value, or, given an
    `error`, fail it with `await_failed` under its own policy (what it waited on failed). The proof
    names the await; the resolver still needs write standing in its workspace, as every write
    surface does (S32)."""
    check_storable(value)
    read_fields(AWAIT_OUTCOME_BODY, {"value": value, "error": error})
    if not isinstance(token, str) or not token or len(token) > 200:
        raise NotFound("await")
    digest = await_token_digest(token)
    run_id = Task.objects.filter(resolution_token=digest).values_list("run_id", flat=True).first()
    if run_id is None:
        raise NotFound("await")
    with locked(run_id, actor_name(user)) as txn:
        if user is not None and not is_member(user, txn.run.workspace_id):
            raise NotFound("await")
        require_write(user, txn.run.workspace_id)
        task = Task.objects.get(resolution_token=digest)
        txn.remember([task])
        if task.status != TaskStatus.DISPATCHED:
            raise Conflict("not_pending", f"the await is {task.status}")
        if error is not None:
            txn.event(task.key, "verb", data={"verb": "resolve", "outcome": "error", "message": error})
            txn.move(task, TaskStatus.FAILED, error=("await_failed", error), finished_at=txn.now, deadline_at=None)
            after_failure(txn, task)
            return txn.run
        txn.event(task.key, "verb", data={"verb": "resolve", "outcome": "value", "value": value})
        txn.complete([(task, value)], result={}, finished_at=txn.now, deadline_at=None)
        release(txn, [task.key])
        return txn.run


def cancel_run(
    *, run_id: Any, user: Any, reason: str = "", failure: dict[str, Any] | None = None, step: Task | None = None
) -> Run:
    """Stop a run: unstarted work is canceled at once, in-flight calls are told to stop."""
    check_field(REASON_BODY, "reason", reason)
    with locked(run_id, actor_name(user)) as txn:
        require_write(user, txn.run.workspace_id)
        cancel(txn, reason=reason, failure=failure, step=step)
        return txn.run


def pause_run(*, run_id: Any, user: Any) -> Run:
    with locked(run_id, actor_name(user)) as txn:
        require_write(user, txn.run.workspace_id)
        pause(txn, {"verb": "pause"})
        return txn.run


def resume_run(*, run_id: Any, user: Any) -> Run:
    with locked(run_id, actor_name(user)) as txn:
        require_write(user, txn.run.workspace_id)
        resume(txn, {"verb": "resume"})
        return txn.run


def note_wait(*, run_id: Any, kind: str, key: str | None, since: datetime, data: Mapping[str, Any]) -> bool:
    """The platform's entry in the audit trail for a wait it reminded or escalated (notify/deadlines.py):
    a `verb` event by `oz0` in the run's trace, written under the run's lock only while the wait is
    still the one that was noticed (the same status, waiting since the same instant). False, and
    nothing written, when it was decided, or ended, meanwhile."""
    try:
        with locked(run_id, PLATFORM_ACTOR) as txn:
            if kind == "hold":
                if txn.run.status != RunStatus.NEEDS_ATTENTION or txn.run.held_since != since:
                    return False
            else:
                # An approval waits in needs_approval, a model's question in awaiting_input.
                waiting = TaskStatus.NEEDS_APPROVAL if kind == "approval" else TaskStatus.AWAITING_INPUT
                task = Task.objects.filter(run=txn.run, key=key or "").only("status", "queued_at").first()
                if task is None or task.status != waiting or task.queued_at != since:
                    return False
            txn.event(key, "verb", data=dict(data))
            return True
    except NotFound:
        return False
