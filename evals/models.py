"""Regression cases (issue 31 item 5): a failed run kept to check later versions of its agent
against, and the evals that run a workspace's cases of one agent on one version.

A case copies what it needs from its run (the run may be deleted by retention; the case stays):
its input, the version it failed on, its failure's kind, error key and group, and, when the run's
model was the `script` provider, the answers that provider had, so that a replay is
deterministic. Those are the run's words: a case is shown by the run's own rule (F11, F12),
read from the privacy, creator and agent it copies (evals.cases.content_visible).

The kernel knows nothing of this app: an eval creates its runs through `runs.kernel.create_run`,
pinned to the version under test and marked with the arm `eval` (`Run.rollout`).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from runs.models import Run
from tenancy.models import Workspace

# What became of a case's run in an eval.
OUTCOMES = ("pending", "completed", "failed", "canceled", "refused", "skipped")
# A case's verdict: the run completed; failed, but with another kind (its case's failure did not
# come back); failed with the same kind again; or no verdict (refused, skipped, canceled, pending).
VERDICTS = ("passed", "passed_other_failure", "failed_again", "none")


class RegressionCase(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="regression_cases")
    agent_name = models.CharField(max_length=100)
    # The run it was kept from: its id only, so the case outlives it.
    source_run_id = models.UUIDField()
    source_version = models.PositiveIntegerField()
    kind = models.CharField(max_length=40)
    error_key = models.CharField(max_length=64, blank=True, default="")
    # Its failure group (insights.FailureGroup by workspace and fingerprint); never shown.
    fingerprint = models.CharField(max_length=32, blank=True, default="")
    input = models.JSONField(null=True, blank=True)
    # The `script` provider's answers the run's model round had (a list, or a map of route to
    # lists); null when its model was a real provider: then an eval runs the agent for real.
    answers = models.JSONField(null=True, blank=True)
    model_route = models.CharField(max_length=200, blank=True, default="")
    # The run's privacy and creator: the case's words follow its run's rule.
    private = models.BooleanField(default=False)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    kept_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    kept_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workspace", "source_run_id"], name="regression_case_once_per_run"),
        ]
        indexes = [models.Index(fields=["workspace", "agent_name", "-id"], name="regression_case_agent")]

    def __str__(self) -> str:
        return f"case {self.pk}: {self.agent_name}@{self.source_version} {self.kind}"


class Eval(models.Model):
    """One run of a workspace's cases of one agent on one version of it."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="evals")
    agent_name = models.CharField(max_length=100)
    version = models.PositiveIntegerField()
    started_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    # The person's name, or "kernel" for the command line acting for the platform.
    actor = models.CharField(max_length=150)
    created_at = models.DateTimeField(auto_now_add=True)
    # Set when every case has an outcome other than pending.
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["workspace", "agent_name", "-id"], name="eval_agent_recent")]

    def __str__(self) -> str:
        return f"eval {self.pk}: {self.agent_name}@{self.version}"


class EvalResult(models.Model):
    """One case in one eval: its kind before, its run, and what became of it."""

    eval = models.ForeignKey(Eval, on_delete=models.CASCADE, related_name="results")
    # Kept when the case is deleted: the eval's record stands.
    case = models.ForeignKey(RegressionCase, null=True, on_delete=models.SET_NULL, related_name="results")
    case_number = models.PositiveBigIntegerField()
    kind_before = models.CharField(max_length=40)
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # The case's recorded answers were replayed (else the version's own model answered).
    replayed = models.BooleanField(default=False)
    outcome = models.CharField(max_length=12, default="pending")
    kind_after = models.CharField(max_length=40, blank=True, default="")
    verdict = models.CharField(max_length=24, default="none")
    # A refusal's kernel error key (`quota_exceeded`, ...) or why a case was skipped; never words.
    reason = models.CharField(max_length=64, blank=True, default="")
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["eval", "case_number"], name="eval_result_once_per_case")]
        indexes = [models.Index(fields=["case", "-id"], name="eval_result_case_recent")]

    def __str__(self) -> str:
        return f"eval {self.eval_id} case {self.case_number}: {self.outcome}"

    @property
    def passed(self) -> bool | None:
        if self.verdict == "none":
            return None
        return self.verdict != "failed_again"
