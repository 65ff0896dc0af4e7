"""The run store: runs, tasks and the append-only trace (workspaces, membership and tokens live in
`tenancy.models`, agents in `oz0agents.models`).

Only `runs.kernel` writes `status` fields; everything else reads through
selectors. Indexes below are chosen for the kernel's hot queries (ready and
live tasks of a run, consumers of a key, the trace after a seq) and for the
console's lists (runs by workspace and status, the inbox's waiting tasks).
"""

from __future__ import annotations

import secrets
import uuid

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVector
from django.db import models
from django.db.models import F, Q
from django.db.models.fields.json import KT, KeyTextTransform


class RunStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    PAUSED = "paused"
    NEEDS_ATTENTION = "needs_attention"
    CANCELING = "canceling"
    COMPLETED = "completed"
    CANCELED = "canceled"


# The status groups, defined once beside the statuses (the kernel's graph rules and the
# index below read them; models cannot import the kernel, which imports them).
RUN_FINISHED = (RunStatus.COMPLETED, RunStatus.CANCELED)
# A run that still takes appends and verbs.
RUN_OPEN = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.PAUSED, RunStatus.NEEDS_ATTENTION)
# A run whose queued work may be taken and whose quiescence is judged.
RUN_WORKING = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.NEEDS_ATTENTION)


# The words of a run's failure as a text-search document: 'simple' (no stemming, no stop words),
# since messages are ids, names and error text more than prose in one language.
FAILURE_MESSAGE_VECTOR = SearchVector(KeyTextTransform("message", "failure"), config="simple")


class Run(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workspace = models.ForeignKey("tenancy.Workspace", on_delete=models.CASCADE, related_name="runs")
    agent_version = models.ForeignKey("agents.AgentVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="runs")
    agent_name = models.CharField(max_length=100, blank=True, default="")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    private = models.BooleanField(default=False)
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.PENDING)
    input = models.JSONField(null=True, blank=True)
    deliverable = models.CharField(max_length=200, blank=True, default="")
    output = models.JSONField(null=True, blank=True)
    error = models.TextField(null=True, blank=True)
    # {kind, retryable, partial, person, message, declared}
    failure = models.JSONField(null=True, blank=True)
    # {reason, blocked_task_keys}
    attention = models.JSONField(null=True, blank=True)
    announcements = ArrayField(models.CharField(max_length=40), default=list, blank=True)
    approval = models.JSONField(default=dict, blank=True)
    retry_budget = models.PositiveIntegerField(default=0)
    # The last trace seq written: the kernel bumps it under the run's row lock.
    last_seq = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Set when a hold starts, cleared when it is released: time-to-repair reads it.
    held_since = models.DateTimeField(null=True, blank=True)
    # A child run (F14-F16): the run and the delegate task that started it, and how deep in the
    # tree it is (a root is 0). The parent's side is Task.child.
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children")
    parent_task_key = models.CharField(max_length=200, blank=True, default="")
    depth = models.PositiveSmallIntegerField(default=0)
    # Another agent's words reached this run without the labels a tool's answer gives them (a flow
    # template, or a tainted parent's input): its model-composed calls always wait for a person (F15).
    tainted = models.BooleanField(default=False)
    # The digest of the agent's code when the run was created (oz0agents.code_version): unlike its
    # version's, it changes when the code changes under the same manifest.
    code_digest = models.CharField(max_length=64, blank=True, default="")
    # 0 (low) to 9 (high): orders the dispatch of its queued calls and rounds within its
    # workspace's share of the workers (runs.kernel.priorities); a child run and a scheduled
    # run take their parent's or their schedule's.
    priority = models.PositiveSmallIntegerField(default=5)
    # The arm of its agent's canary rollout the run was assigned to ("canary", "stable"), by a
    # hash of its id (oz0agents.rollouts); "" when no rollout was under way.
    rollout = models.CharField(max_length=8, blank=True, default="")

    class Meta:
        indexes = [
            models.Index(fields=["workspace", "-created_at"], name="run_ws_recent"),
            models.Index(fields=["workspace", "status", "-created_at"], name="run_ws_status_recent"),
            models.Index(fields=["agent_name", "-created_at"], name="run_agent_recent"),
            # Full-text search over failure messages (insights.search); the query repeats this expression.
            GinIndex(FAILURE_MESSAGE_VECTOR, name="run_failure_message_fts"),
        ]

    def __str__(self) -> str:
        return str(self.id)


class TaskKind(models.TextChoices):
    ROUND = "round"
    TOOL = "tool"
    AWAIT = "await"
    JOIN = "join"
    DELEGATE = "delegate"
    SUMMARIZER = "summarizer"


class TaskStatus(models.TextChoices):
    WAITING = "waiting"
    NEEDS_APPROVAL = "needs_approval"
    RUNNING = "running"
    DISPATCHED = "dispatched"
    AWAITING_INPUT = "awaiting_input"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"
    TIMED_OUT = "timed_out"
    UNCERTAIN = "uncertain"
    SKIPPED = "skipped"


# Someone (the kernel, a runner, an approver, a person) holds these right now.
TASK_LIVE = ("needs_approval", "running", "dispatched", "awaiting_input")
TASK_SETTLED = ("completed", "failed", "canceled", "timed_out", "uncertain", "skipped")
TASK_FAILED = ("failed", "timed_out", "uncertain")
# A person decides these (an approval, an answer): they are announced and stamped on the run.
TASK_ASKING = ("needs_approval", "awaiting_input")


class OnFailure(models.TextChoices):
    PROPAGATE = "propagate"
    ABSORB = "absorb"
    HALT = "halt"


class Task(models.Model):
    # No index of its own: the unique (run, key) serves every lookup by run (each index is paid
    # again on every write of a task's row).
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="tasks", db_index=False)
    key = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=TaskKind.choices)
    after = ArrayField(models.CharField(max_length=200), default=list, blank=True)
    on_failure = models.CharField(max_length=16, choices=OnFailure.choices, default=OnFailure.PROPAGATE)
    # The kind's own fields (tool/args, model/prompt/script, question, mode/quorum, ...).
    spec = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=20, choices=TaskStatus.choices, default=TaskStatus.WAITING)
    # A waiting task whose sources are settled and which is queued for a worker.
    ready = models.BooleanField(default=False)
    attempt = models.PositiveIntegerField(default=0)
    lineage = models.CharField(max_length=200)
    # True for tasks a round authored (model-composed): they pass the approval stage.
    composed = models.BooleanField(default=False)
    error_key = models.CharField(max_length=64, null=True, blank=True)
    error_detail = models.TextField(null=True, blank=True)
    failure_resolution = models.CharField(max_length=16, null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    # Private working state of the kind's machine (provider calls spent per route, history).
    state = models.JSONField(default=dict, blank=True)
    # Who holds a running/dispatched task, and since when they last proved alive.
    claim = models.CharField(max_length=64, null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)
    # The SHA-256 of a client await's bearer proof (S8); the proof itself rode out in the receipt only.
    # Unique by a constraint (see Meta), not `unique=True`, which adds a LIKE index no lookup uses.
    resolution_token = models.CharField(max_length=64, null=True, blank=True)
    # The digest (SHA-256 of tool + args) a model-composed call was approved for, by a person or a
    # rule; the call runs only while its arguments still hash to it (runs.kernel.approvals).
    approved_digest = models.CharField(max_length=64, null=True, blank=True)
    # The key of the failure that made this task skipped (a retry revives its skips).
    skipped_by = models.CharField(max_length=200, null=True, blank=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    deadline_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    position = models.PositiveIntegerField(default=0)
    # A delegate task's child run (its latest one: a retry starts another); Run.parent is the other side.
    # Indexed only where set (task_child, below).
    child = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "key"], name="task_unique_key"),
            # Only client awaits carry a token: the NULLs of every other task stay out of the index.
            models.UniqueConstraint(
                fields=["resolution_token"], name="task_unique_resolution_token", condition=Q(resolution_token__isnull=False)
            ),
        ]
        # A status change cannot be a HOT update (status is in the partial indexes below), so it
        # writes a new entry into every index of the table, NULL entries included: the two
        # columns almost every task leaves NULL are indexed only where set.
        indexes = [
            # Quiescence: does the run have anything live or ready?
            models.Index(
                fields=["run"],
                name="task_run_busy",
                condition=Q(status__in=TASK_LIVE) | Q(status="waiting", ready=True),
            ),
            # Sweeps: claimed calls by heartbeat, queued calls by age, clocks by deadline.
            models.Index(
                fields=["status", "heartbeat_at"], name="task_claimed", condition=Q(status__in=("running", "dispatched"))
            ),
            models.Index(fields=["queued_at"], name="task_queued", condition=Q(status="waiting", ready=True)),
            models.Index(fields=["deadline_at"], name="task_deadline", condition=Q(deadline_at__isnull=False)),
            # The inbox: what waits on a person, newest-first per workspace via the run.
            models.Index(fields=["status", "queued_at"], name="task_person", condition=Q(status__in=TASK_ASKING)),
            models.Index(fields=["run", "position"], name="task_run_position"),
            # A child run's delegate task (delegation, and the SET NULL when a run is deleted).
            models.Index(fields=["child"], name="task_child", condition=Q(child__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.run_id}:{self.key}"

    @property
    def error(self) -> dict[str, str | None] | None:
        if self.error_key is None:
            return None
        return {"key": self.error_key, "detail": self.error_detail}


class Edge(models.Model):
    """One `after` edge, indexed by source so a settle finds its consumers in O(degree)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+", db_index=False)  # edge_run_source serves it
    source = models.CharField(max_length=200)
    consumer = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="+")

    class Meta:
        indexes = [models.Index(fields=["run", "source"], name="edge_run_source")]

    def __str__(self) -> str:
        return f"{self.source} -> {self.consumer_id}"


class TraceEvent(models.Model):
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="trace", db_index=False
    )  # the unique (run, seq) serves it
    seq = models.PositiveBigIntegerField()
    at = models.DateTimeField(auto_now_add=True)
    task_key = models.CharField(max_length=200, null=True, blank=True)
    event = models.CharField(max_length=40)
    from_status = models.CharField(max_length=20, null=True, blank=True)
    to_status = models.CharField(max_length=20, null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    actor = models.CharField(max_length=150, blank=True, default="")
    data = models.JSONField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="trace_unique_seq")]
        indexes = [
            models.Index(fields=["run", "task_key", "seq"], name="trace_run_task"),
            # The audit trail (runs/audit.py) reads people's verbs newest first: a small index over
            # those rows only, instead of a scan of every event of every run.
            models.Index(fields=["-at", "-id"], name="trace_audit_at", condition=Q(event__in=["verb", "appended"])),
            # Filtered by verb: the expression also gives the planner statistics on `data->>'verb'`.
            models.Index(KT("data__verb"), F("at").desc(), F("id").desc(), name="trace_audit_verb", condition=Q(event="verb")),
            # The runs list's badges (runs/run_list.py): a run's people's verbs and rules' denials,
            # a few rows per run, so a page of runs never reads their whole traces.
            models.Index(fields=["run"], name="trace_run_decisions", condition=Q(event__in=["verb", "approval_denied"])),
        ]
        ordering = ["seq"]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.event}"


def new_token() -> str:
    return secrets.token_urlsafe(32)


class Finding(models.Model):
    """A failed run's summary: kind, flags, step and attempts, never its words.

    It outlives the run's content (no foreign key to the run), so scorecards and
    job search keep counting after a run is deleted or tombstoned.
    """

    run_id = models.UUIDField(db_index=True)
    workspace_id = models.BigIntegerField()
    agent_name = models.CharField(max_length=100, blank=True, default="")
    agent_version = models.PositiveIntegerField(null=True, blank=True)
    kind = models.CharField(max_length=40)
    retryable = models.BooleanField(default=False)
    partial = models.BooleanField(default=False)
    person = models.BooleanField(default=False)
    declared = models.BooleanField(default=False)
    step_key = models.CharField(max_length=200, blank=True, default="")
    step_kind = models.CharField(max_length=16, blank=True, default="")
    error_key = models.CharField(max_length=64, blank=True, default="")
    attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(db_index=True)
    # Its failure group (runs.fingerprints): a digest of kind, agent, error key and message shape,
    # never shown. The database default lets bulk loaders that predate it insert without it.
    fingerprint = models.CharField(max_length=32, blank=True, default="", db_default="")

    class Meta:
        indexes = [
            models.Index(fields=["workspace_id", "fingerprint", "-created_at"], name="finding_group_recent"),
            models.Index(fields=["agent_name", "kind", "created_at"], name="finding_agent_kind"),
            models.Index(fields=["agent_name", "agent_version", "created_at"], name="finding_agent_version"),
            models.Index(fields=["kind", "-created_at"], name="finding_kind_recent"),
        ]

    def __str__(self) -> str:
        return f"{self.agent_name or '-'} {self.kind} ({self.run_id})"


class Executor(models.Model):
    """A runner outside the workers that serves tools (S8, S10).

    It registers with an operator's token and gets a bearer token of its own (only its
    SHA-256 is stored); it claims advertised calls of the workspaces its owner operates
    (or of its one workspace), holds each under a lease it renews by heartbeat, and reports
    the result. A revoked executor can do nothing more.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=100, blank=True, default="")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="executors")
    # Serve only this workspace's calls; null: every workspace the owner has write standing in.
    workspace = models.ForeignKey("tenancy.Workspace", null=True, blank=True, on_delete=models.CASCADE, related_name="executors")
    tools = ArrayField(models.CharField(max_length=100), default=list)
    token_digest = models.CharField(max_length=64, unique=True)
    revoked = models.BooleanField(default=False)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["revoked", "last_heartbeat_at"], name="executor_live")]

    def __str__(self) -> str:
        return self.name or str(self.id)


class IdempotencyKey(models.Model):
    """The first answer to a create or append sent with an `Idempotency-Key` header, written in the
    request's own transaction (runs/idempotency.py): a retry with the key gets it again."""

    workspace = models.ForeignKey("tenancy.Workspace", on_delete=models.CASCADE, related_name="+", db_index=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    # SHA-256 of the method, the path and the body (canonical JSON): what "the same request" means.
    fingerprint = models.CharField(max_length=64)
    status = models.PositiveSmallIntegerField()
    answer = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workspace", "user", "key"], name="idempotency_unique_key")]

    def __str__(self) -> str:
        return self.key
