"""A fuzz pass over the OpenAPI document with schemathesis: whatever a client sends to any
operation it describes, oz0 answers below 500 (bad input gets a typed 4xx, never a crash).

Runs in-process against the WSGI app on the test database, as an operator and as a viewer,
with a bounded number of examples per operation so the pass takes a few minutes on 2 cores.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import schemathesis
from django.contrib.auth.models import User
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, settings
from ninja.responses import NinjaJSONEncoder

from runs.models import Membership, Run
from tests.conftest import Api
from tests.factories import make_token, make_workspace, unique
from tests.runs.driver import drive, echo, fail

EXAMPLES_PER_OPERATION = 25


@pytest.fixture
def _requests_share_the_test_transaction() -> Iterator[None]:
    """The WSGI handler closes "old" connections around each request; inside a test's transaction
    that would close the test's own connection (Django's test client disconnects them the same way)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def _load_schema() -> Any:
    """The document the API serves, less the catalog's failure kinds (read from the database at
    request time; collection has no database), bound to the WSGI app."""
    from django.core.wsgi import get_wsgi_application
    from ninja import NinjaAPI

    from oz0site.api import api

    document = NinjaAPI.get_openapi_schema(api, path_prefix="/api/v1/")
    loaded = schemathesis.openapi.from_dict(json.loads(json.dumps(document, cls=NinjaJSONEncoder)))
    loaded.app = get_wsgi_application()
    return loaded


schema = _load_schema()


def _tamed(case: Any) -> None:
    """The wait endpoint blocks up to its timeout (60 s at most, 30 s when none is given): keep the
    fuzz quick there, or a handful of waits on the staged run outlast the test's own timeout."""
    if not case.operation.path.endswith("/wait"):
        return
    if not isinstance(case.query, dict):
        case.query = {}
    if "timeout" not in case.query:
        case.query["timeout"] = 0.05
    else:
        try:
            timeout = float(case.query["timeout"])
        except (TypeError, ValueError):
            return
        if not math.isfinite(timeout) or timeout > 0.05:
            case.query["timeout"] = 0.05


@dataclass
class Stage:
    """A workspace with an operator and a viewer, and real objects for the fuzz's second call of
    each case, so that bodies and queries reach the code behind the 404s a random id gets: a
    held run, a client await, an agent, an executor."""

    slug: str
    tokens: dict[str, str]
    run_id: str
    held_run_id: str
    await_token: str
    agent: str
    executor_id: str
    executor_token: str

    def path_parameters(self, generated: dict[str, Any]) -> dict[str, Any]:
        real = {
            "ws": self.slug,
            "token": self.await_token,
            "name": self.agent,
            "agent": self.agent,
            "executor_id": self.executor_id,
        }
        parameters = {name: real.get(name, value) for name, value in generated.items()}
        if "run_id" in parameters:
            # The held run or the running one, picked by the generated value.
            parameters["run_id"] = self.held_run_id if len(str(generated["run_id"])) % 2 else self.run_id
        if "key" in parameters:
            parameters["key"] = ("f", "q", "a", str(generated["key"]))[len(str(generated["key"])) % 4]
        return parameters


@pytest.fixture
def stage(db: Any, no_dispatch: list[int]) -> Stage:
    workspace = make_workspace()
    tokens = {}
    for role in ("operator", "viewer"):
        # No password: hashing one costs more than a whole pass over an operation.
        user = User.objects.create(username=unique(role))
        Membership.objects.create(workspace=workspace, user=user, role=role)
        tokens[role] = make_token(user=user)
    operator = Api(tokens["operator"])
    _, created = operator.post(
        f"/workspaces/{workspace.slug}/runs",
        {"tasks": [{"key": "q", "kind": "await", "question": "?"}, echo("a")], "deliverable": "a"},
    )
    _, held = operator.post(f"/workspaces/{workspace.slug}/runs", {"tasks": [fail("f", on_failure="halt")], "deliverable": "f"})
    drive(Run.objects.get(pk=held["run"]["id"]))
    manifest = "name: fuzzed\nmodel: script\ntools: [oz.fail]\nfailures:\n  - kind: not_found\n    description: gone\n"
    status, registered = operator.post("/agents", {"manifest": manifest})
    assert status == 201, registered
    status, executor = operator.post("/executors", {"tools": ["test.remote"]})
    assert status == 201, executor
    return Stage(
        slug=workspace.slug,
        tokens=tokens,
        run_id=created["run"]["id"],
        held_run_id=held["run"]["id"],
        await_token=created["receipt"]["tokens"]["q"],
        agent="fuzzed",
        executor_id=executor["id"],
        executor_token=executor["token"],
    )


def _fuzz(case: Any, stage: Stage, role: str) -> None:
    _tamed(case)
    _call(case, stage.tokens[role])
    if case.path_parameters:
        case.path_parameters = stage.path_parameters(case.path_parameters)
    token = stage.executor_token if "/executors/{executor_id}" in case.operation.path else stage.tokens[role]
    _call(case, token)


def _call(case: Any, token: str) -> None:
    response = case.call(headers={"Authorization": f"Bearer {token}"})
    assert response.status_code < 500, f"{response.status_code} for {case.as_curl_command()}:\n{response.text[:2000]}"


FUZZ = settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)


@pytest.mark.timeout(120)
@schema.parametrize()
@FUZZ
def test_it_never_answers_500_to_an_operator(case: Any, stage: Stage, _requests_share_the_test_transaction: None) -> None:
    _fuzz(case, stage, "operator")


@pytest.mark.timeout(120)
@schema.parametrize()
@FUZZ
def test_it_never_answers_500_to_a_viewer(case: Any, stage: Stage, _requests_share_the_test_transaction: None) -> None:
    _fuzz(case, stage, "viewer")
