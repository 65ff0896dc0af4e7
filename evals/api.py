"""Regression cases and evals in the JSON API (issue 31 item 5).

- `POST /runs/{run_id}/regression-case`: keep a failed run as a case (operators; 201, or 200 with
  the case kept before);
- `GET /workspaces/{ws}/regression-cases`, `DELETE .../{case_id}`: every member reads (the words
  by the run's rule), operators delete;
- `POST /workspaces/{ws}/evals` `{agent, version}`: run the agent's cases against a version (operators);
- `GET /workspaces/{ws}/evals/{eval_id}`: the eval with each case's kind before and after, outcome
  and verdict (every member: kinds only, no words).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router, Status

from evals import cases, running
from evals.models import OUTCOMES, VERDICTS
from oz0site.auth import person_auth
from runs import selectors
from runs.api import ERRORS, body_of, request_body
from runs.schemas import Out, Page

router = Router(tags=["regression cases"])


class CaseOut(Out):
    id: int
    agent: str
    source_run: str
    source_version: int
    kind: str
    error_key: str | None = None
    # The failure group's id (GET /groups/{id}); null when the group is gone.
    group: int | None = None
    model_route: str | None = None
    # The case carries the `script` provider's answers: a scripted version replays them.
    replayable: bool
    private: bool
    # Whether `input` and `answers` are shown: the run's own rule (F11, F12).
    content_visible: bool
    input: Any = None
    answers: Any = None
    kept_by: str | None = None
    kept_at: str


class ResultOut(Out):
    case: int
    run: str | None = None
    replayed: bool
    kind_before: str
    outcome: str
    kind_after: str | None = None
    verdict: str
    # True: the case's failure did not come back; false: it did; null: no verdict (yet).
    passed: bool | None = None
    reason: str | None = None


class CountsOut(Out):
    cases: int
    passed: int
    failed: int
    pending: int
    no_verdict: int


class EvalOut(Out):
    id: int
    agent: str
    version: int
    started_by: str
    created_at: str
    finished_at: str | None = None
    counts: CountsOut
    results: list[ResultOut]


EVAL_BODY = request_body(
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["agent", "version"],
        "properties": {
            "agent": {"type": "string", "pattern": r"^[a-z][a-z0-9_.-]*$", "maxLength": 100},
            "version": {"type": "integer", "minimum": 1, "maximum": running.VERSION_MAX},
        },
    }
)
RESULTS_SUMMARY = f"outcomes {', '.join(OUTCOMES)}; verdicts {', '.join(VERDICTS)}"


@router.post(
    "/runs/{run_id}/regression-case",
    auth=person_auth("operator", where="run_id", rate="write"),
    response={200: CaseOut, 201: CaseOut, **ERRORS},
    summary="Keep a failed run as a regression case of its agent (the same run again: its case, 200)",
)
def keep_case(request: HttpRequest, run_id: str) -> Status[dict[str, Any]]:
    case, created = cases.keep(user=request.user, run_id=run_id)
    return Status(201 if created else 200, cases.document(request.user, case))


@router.get(
    "/workspaces/{ws}/regression-cases",
    auth=person_auth("viewer", where="ws", rate="read"),
    response={200: Page[CaseOut], **ERRORS},
    summary="The workspace's regression cases, by agent (input and answers only to those who may read them)",
)
def list_cases(request: HttpRequest, ws: str) -> dict[str, Any]:
    workspace = selectors.workspace_for(request.user, ws)
    rows = list(cases.cases_of(workspace))
    groups = cases.group_ids(rows)
    return {"items": [cases.document(request.user, c, groups=groups) for c in rows], "next": None}


@router.delete(
    "/workspaces/{ws}/regression-cases/{case_id}",
    auth=person_auth("operator", where="ws", rate="write"),
    response={204: None, **ERRORS},
    summary="Delete a regression case (the evals that ran it keep their results)",
)
def delete_case(request: HttpRequest, ws: str, case_id: int) -> Status[None]:
    workspace = selectors.workspace_for(request.user, ws)
    cases.delete(workspace=workspace, user=request.user, case_id=case_id)
    return Status(204, None)


@router.post(
    "/workspaces/{ws}/evals",
    auth=person_auth("operator", where="ws", rate="write"),
    response={201: EvalOut, **ERRORS},
    openapi_extra=EVAL_BODY,
    summary="Run an agent's regression cases against one of its versions: one run per case, marked `eval`",
)
def start_eval(request: HttpRequest, ws: str) -> Status[dict[str, Any]]:
    workspace = selectors.workspace_for(request.user, ws)
    evaluation = running.start(workspace=workspace, user=request.user, body=body_of(request))
    return Status(201, running.document(evaluation))


@router.get(
    "/workspaces/{ws}/evals/{eval_id}",
    auth=person_auth("viewer", where="ws", rate="read"),
    response={200: EvalOut, **ERRORS},
    summary=f"An eval and each case's kind before and after ({RESULTS_SUMMARY})",
)
def read_eval(request: HttpRequest, ws: str, eval_id: int) -> dict[str, Any]:
    workspace = selectors.workspace_for(request.user, ws)
    return running.document(running.refresh(running.eval_for(workspace, eval_id)))
