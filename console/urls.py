"""The console's routes: its pages (runs, inbox, agents and scorecards, holds, audit, tokens,
settings) and one route per verb (each path as before)."""

from django.urls import path

from console import audit, bulk_repair, holds, inbox_pages, insights_pages, run_pages, tokens, verbs, workspace_settings

TASK = "runs/<uuid:run_id>/tasks/<path:key>"
RUN = "runs/<uuid:run_id>"

urlpatterns = [
    path("w/<slug:slug>/inbox/", inbox_pages.inbox, name="inbox"),
    path("w/<slug:slug>/agents/", insights_pages.agents, name="agents"),
    path("w/<slug:slug>/agents/<str:name>/", insights_pages.scorecard, name="scorecard"),
    path("", run_pages.home, name="home"),
    path("w/<slug:slug>/", run_pages.workspace_home, name="workspace"),
    path("w/<slug:slug>/runs/", run_pages.runs_list, name="runs"),
    path("runs/<uuid:run_id>/", run_pages.run_detail, name="run"),
    path("tokens/", tokens.token_list, name="tokens"),
    path("tokens/<int:token_id>/revoke/", tokens.token_revoke, name="token_revoke"),
    path("w/<slug:slug>/holds/", holds.holds, name="holds"),
    path("w/<slug:slug>/holds/bulk/preview/", bulk_repair.bulk_preview, name="holds_bulk_preview"),
    path("w/<slug:slug>/holds/bulk/apply/", bulk_repair.bulk_apply, name="holds_bulk_apply"),
    path("w/<slug:slug>/audit/", audit.audit_trail, name="audit"),
    path("w/<slug:slug>/settings/", workspace_settings.workspace_settings, name="workspace_settings"),
    path(f"{TASK}/approve/", verbs.approve, name="task_approve"),
    path(f"{TASK}/deny/", verbs.deny, name="task_deny"),
    path(f"{TASK}/answer/", verbs.answer, name="task_answer"),
    path(f"{TASK}/retry/", verbs.retry, name="task_retry"),
    path(f"{TASK}/abandon/", verbs.abandon, name="task_abandon"),
    path(f"{TASK}/compact/", verbs.compact, name="task_compact"),
    path(f"{RUN}/cancel/", verbs.cancel, name="run_cancel"),
    path(f"{RUN}/pause/", verbs.pause, name="run_pause"),
    path(f"{RUN}/resume/", verbs.resume, name="run_resume"),
    path(f"{RUN}/append/", verbs.append, name="run_append"),
]
