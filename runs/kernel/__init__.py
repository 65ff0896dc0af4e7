"""The run kernel: the one writer of run and task statuses.

Every transition runs inside one transaction that holds the run's row lock
(`SELECT ... FOR UPDATE`), changes rows with a condition on their current status,
and appends its trace events in the same transaction. Celery sends and channel
broadcasts are registered with `transaction.on_commit`, so nothing leaves the
process for a change that rolled back.

Views, Celery tasks, consumers and commands call the names exported here; nobody else
assigns a status, and nobody outside the kernel imports one of its modules.

The modules, each importing only from the layers above it (KERNEL_LAYERS in
tests/runs/test_architecture.py holds the order):

    errors                    typed refusals the API answers
    graph, access, approvals  pure graph rules and the status groups; who acts, write standing;
      guards                  what an approval is bound to (a call's digest) and the rules' matchers;
                              a flow step's `when:` guard, parsed by a whitelist (never eval)
    compile, candidates       a request compiled (RunRequest, TaskSpec) and checked; no HTTP, no writes
    bulk                      set-based statements, each a compare-and-set the caller checks
    txn                       Txn: a transaction's changes recorded (moves, the one completion path,
                              trace, due run steps, sends, children, messages to other runs)
    children                  a ready delegate task's child run opened (its tasks wait for the commit)
    scheduling                evaluate, release, make_ready/start, approval gate, joins, after_failure
    settling, failure         quiescence, holds, stamps, cancels, findings; auto-retry, replayability
    expansion, delegation     tasks enter a run (add_tasks, expand); a child's end, a parent's stop
    commit                    the unit of work: locked() and commit() in one order; the Sender port;
                              messages between runs, each delivered in a transaction of its own
    intake, verbs, worker,    create and append; a person's verbs; claim/heartbeat/report keyed by
      sweeps                  Claimed; clocks, lost work (to workers and between runs)
    leases, rounds            runner leases; a model's answer applied to the graph

Layers run one way too: a lower layer records what it cannot do itself, and the commit (which
imports them) does it; nothing is installed into a lower layer but the `Sender` port.
"""

from __future__ import annotations

from runs.kernel.access import require_write
from runs.kernel.approvals import call_decision, call_digest, rule_problems, spec_digest
from runs.kernel.approvals import problem_field as approval_problem_field
from runs.kernel.candidates import repair_candidates_of
from runs.kernel.commit import Sender, cancel_child, install_sender, quick_chunks, settle_parent
from runs.kernel.compile import (
    DELEGATE_TOOLS,
    Pinned,
    RunRequest,
    TaskSpec,
    check_storable,
    compile_create,
    compile_tasks,
    delegate_call_spec,
)
from runs.kernel.delegation import words_of
from runs.kernel.errors import (
    Conflict,
    ContentHidden,
    Forbidden,
    InvalidRequest,
    KernelError,
    NotAnApprover,
    NotFound,
    QuotaExceeded,
)
from runs.kernel.expansion import await_token_digest
from runs.kernel.failure import NOT_MADE, call_replayable, nonreplayable_calls
from runs.kernel.graph import (
    ASKING_STATUSES,
    FAILED_STATUSES,
    FINISHED_RUN_STATUSES,
    LIVE_STATUSES,
    OPEN_RUN_STATUSES,
    SETTLED_STATUSES,
    repair_candidates,
)
from runs.kernel.guards import GuardError, evaluate_guard, guard_steps, parse_guard
from runs.kernel.holder_sessions import end_frozen_holder_sessions, holder_session_name
from runs.kernel.intake import append, create_run, input_bytes, quota_limits
from runs.kernel.journal import journal_call, round_checkpoint, round_park, round_replayed, round_resumed
from runs.kernel.leases import (
    LeasedCall,
    claim_call,
    claim_prefix,
    held_call,
    lease_seconds,
    renew_lease,
    revoke_calls,
    sweep_expired_leases,
    sweep_unserved_calls,
)
from runs.kernel.numbers import whole_number
from runs.kernel.output_schemas import free_text_paths
from runs.kernel.priorities import WAITING_KEY as PRIORITY_WAITING_KEY
from runs.kernel.priorities import message_priority, parse_priority
from runs.kernel.priorities import name_of as priority_name
from runs.kernel.releases import call_states, heartbeat_many, round_reattach, round_release
from runs.kernel.request_shapes import (
    ANSWER_BODY,
    APPROVE_BODY,
    AWAIT_OUTCOME_BODY,
    DIGEST_PATTERN,
    EXECUTOR_TOOLS_MAX,
    MAX_DEPTH,
    MAX_ENTRIES,
    MAX_PAYLOAD_BYTES,
    MAX_TIMEOUT_SECONDS,
    REASON_BODY,
    REGISTER_BODY,
    RESOLVE_BODY,
    RESULT_BODY,
    RETRY_BODY,
    SLUG_PATTERN,
    BodyShape,
    append_body_schema,
    body_schema,
    check_field,
    create_body_schema,
    is_digest,
    read_fields,
)
from runs.kernel.rounds import (
    round_answered,
    round_ask,
    round_call,
    round_compact,
    round_expand,
    round_oz_fail,
    round_switch,
)
from runs.kernel.scheduling import round_timeout_seconds
from runs.kernel.sweeps import (
    MAX_EXPIRED_CLAIMS,
    seconds_to_next_claim_expiry,
    sweep_clocks,
    sweep_delegations,
    sweep_expired_claims,
    sweep_lost_messages,
)
from runs.kernel.templates import TemplateError, template_steps
from runs.kernel.templates import render as render_template
from runs.kernel.verbs import (
    abandon,
    answer,
    approve,
    approve_edited,
    cancel_run,
    compact,
    deny,
    note_wait,
    pause_run,
    resolve_await,
    resume_run,
    retry,
)
from runs.kernel.worker import (
    NO_ROOM,
    Claimed,
    NoRoom,
    Outcome,
    SessionClaim,
    claim_batch,
    claim_session,
    claim_task,
    defer_queued,
    heartbeat,
    report_batch,
    running_sessions,
    send_within_share,
    session_room,
    task_complete,
    task_errored,
    task_fail,
    task_stopped,
    workers_held,
)

__all__ = [
    "ANSWER_BODY",
    "APPROVE_BODY",
    "AWAIT_OUTCOME_BODY",
    "DIGEST_PATTERN",
    "EXECUTOR_TOOLS_MAX",
    "REASON_BODY",
    "REGISTER_BODY",
    "RESOLVE_BODY",
    "RESULT_BODY",
    "RETRY_BODY",
    "SLUG_PATTERN",
    "BodyShape",
    "body_schema",
    "check_field",
    "read_fields",
    "DELEGATE_TOOLS",
    "ASKING_STATUSES",
    "FAILED_STATUSES",
    "FINISHED_RUN_STATUSES",
    "LIVE_STATUSES",
    "MAX_DEPTH",
    "MAX_ENTRIES",
    "MAX_EXPIRED_CLAIMS",
    "MAX_PAYLOAD_BYTES",
    "MAX_TIMEOUT_SECONDS",
    "OPEN_RUN_STATUSES",
    "SETTLED_STATUSES",
    "Claimed",
    "Conflict",
    "ContentHidden",
    "Forbidden",
    "GuardError",
    "InvalidRequest",
    "KernelError",
    "QuotaExceeded",
    "NotAnApprover",
    "note_wait",
    "input_bytes",
    "quota_limits",
    "LeasedCall",
    "NotFound",
    "Outcome",
    "Pinned",
    "RunRequest",
    "TaskSpec",
    "Sender",
    "abandon",
    "answer",
    "append",
    "approval_problem_field",
    "approve",
    "approve_edited",
    "await_token_digest",
    "call_digest",
    "is_digest",
    "cancel_child",
    "cancel_run",
    "append_body_schema",
    "check_storable",
    "create_body_schema",
    "compile_create",
    "compile_tasks",
    "claim_batch",
    "claim_call",
    "claim_prefix",
    "claim_session",
    "NO_ROOM",
    "NoRoom",
    "claim_task",
    "SessionClaim",
    "compact",
    "create_run",
    "delegate_call_spec",
    "deny",
    "evaluate_guard",
    "free_text_paths",
    "whole_number",
    "guard_steps",
    "heartbeat",
    "held_call",
    "install_sender",
    "message_priority",
    "PRIORITY_WAITING_KEY",
    "parse_priority",
    "priority_name",
    "defer_queued",
    "send_within_share",
    "running_sessions",
    "session_room",
    "TemplateError",
    "template_steps",
    "render_template",
    "lease_seconds",
    "nonreplayable_calls",
    "NOT_MADE",
    "call_replayable",
    "parse_guard",
    "pause_run",
    "quick_chunks",
    "renew_lease",
    "repair_candidates",
    "repair_candidates_of",
    "report_batch",
    "require_write",
    "resolve_await",
    "resume_run",
    "retry",
    "revoke_calls",
    "journal_call",
    "round_park",
    "round_release",
    "round_reattach",
    "heartbeat_many",
    "call_states",
    "round_answered",
    "round_checkpoint",
    "round_replayed",
    "round_resumed",
    "round_ask",
    "round_compact",
    "round_expand",
    "round_call",
    "round_oz_fail",
    "round_switch",
    "round_timeout_seconds",
    "rule_problems",
    "settle_parent",
    "end_frozen_holder_sessions",
    "holder_session_name",
    "seconds_to_next_claim_expiry",
    "spec_digest",
    "call_decision",
    "sweep_clocks",
    "sweep_delegations",
    "sweep_expired_claims",
    "sweep_expired_leases",
    "sweep_lost_messages",
    "sweep_unserved_calls",
    "task_complete",
    "task_errored",
    "task_fail",
    "task_stopped",
    "workers_held",
    "words_of",
]
