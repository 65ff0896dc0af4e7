"""A fuzz pass over the OpenAPI document with schemathesis: whatever a client sends to any
operation it describes, oz0 answers below 500 (bad input gets a typed 4xx, never a crash), and
as an operator every schemathesis check holds (issue 27.8): what the document calls valid is
accepted, what it calls invalid refused, statuses, headers and bodies as documented.

Runs in-process against the WSGI app on the test database, with a bounded number of examples per
operation so the pass stays well under a minute on 2 cores.

KNOWN_GAPS names the checks still left out per operation, each with the rule the document cannot
say yet (a program's meaning, the catalog of installed tools, a query language): every other
operation runs every check.
"""

from __future__ import annotations

import json
import math
import os
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
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from runs.models import Run
from tenancy.models import Membership
from tests.conftest import Api
from tests.factories import make_token, make_workspace, unique
from tests.runs.driver import drive, echo, fail

EXAMPLES_PER_OPERATION = int(os.environ.get("OZ0_FUZZ_EXAMPLES", "3"))

POSITIVE = "positive_data_acceptance"
NEGATIVE = "negative_data_rejection"
# (method, path) -> the checks left out there, and why. Shrink this list; never grow it quietly.
KNOWN_GAPS: dict[tuple[str, str], tuple[set[str], str]] = {
    ("POST", "/workspaces/{ws}/runs"): (
        {POSITIVE},
        "a run's tasks are a program: the kernel's graph rules (joins need sources, ...)",
    ),
    ("POST", "/runs/{run_id}/append"): ({POSITIVE}, "as a create's tasks"),
    ("POST", "/agents"): ({POSITIVE}, "a manifest is YAML the linter reads (F2-F8)"),
    ("POST", "/workspaces/{ws}/agents"): ({POSITIVE}, "a manifest is YAML the linter reads (F2-F8)"),
    ("POST", "/agents/lint"): ({POSITIVE}, "a manifest is YAML the linter reads (F2-F8)"),
    ("POST", "/executors"): ({POSITIVE}, "tools must be installed runner tools (the catalog, not the schema)"),
    ("GET", "/findings"): ({POSITIVE}, "q is a query language (name:value terms)"),
    ("POST", "/workspaces/{ws}/holds/retry"): ({POSITIVE}, "a whole-number float (1.0) is refused as a version"),
    ("POST", "/workspaces/{ws}/holds/abandon"): ({POSITIVE}, "a whole-number float (1.0) is refused as a version"),
    ("GET", "/insights/agents/{agent}"): ({NEGATIVE}, "pydantic reads a number (0.5) as a moment"),
    ("GET", "/workspaces/{ws}/audit"): ({NEGATIVE}, "pydantic reads a number (0.5) as a moment"),
}


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
ALL_CHECKS = (positive_data_acceptance, negative_data_rejection)


def _plain_numbers(value: Any) -> Any:
    """Values as an oz0 client must send them (S31: the row store holds neither NUL bytes nor
    exponent-form numbers, which a JSON schema cannot say): a float whose text would be in
    exponent form becomes its whole part (0 below one), a NUL byte in a text goes."""
    if isinstance(value, float) and "e" in repr(value).lower():
        return int(value) if math.isfinite(value) and abs(value) >= 1 else 0
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, list):
        return [_plain_numbers(item) for item in value]
    if isinstance(value, dict):
        return {_plain_numbers(key): _plain_numbers(item) for key, item in value.items()}
    return value


def _tamed(case: Any) -> None:
    if not isinstance(case.body, (bytes, str)) and case.body is not None:
        case.body = _plain_numbers(case.body)
    if isinstance(case.query, dict):
        # A cursor is the server's, as an id is: a made-up one is refused (400 invalid_cursor).
        case.query.pop("cursor", None)
        case.query = _plain_numbers(case.query)
    if isinstance(case.path_parameters, dict):
        case.path_parameters = _plain_numbers(case.path_parameters)
    _tamed_wait(case)


def _tamed_wait(case: Any) -> None:
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
        # An e-mail address: a subscription by e-mail needs one (no_email_address otherwise).
        user = User.objects.create(username=unique(role), email=f"{role}@example.com")
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


def _fuzz(case: Any, stage: Stage, role: str, *, every_check: bool) -> None:
    _tamed(case)
    _call(case, stage.tokens[role], every_check=every_check)
    if case.path_parameters:
        case.path_parameters = stage.path_parameters(case.path_parameters)
    token = stage.executor_token if "/executors/{executor_id}" in case.operation.path else stage.tokens[role]
    _call(case, token, every_check=every_check)


def _call(case: Any, token: str, *, every_check: bool) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    if every_check:
        path = case.operation.path.removeprefix("/api/v1")
        left_out, _ = KNOWN_GAPS.get((case.operation.method.upper(), path), (set(), ""))
        excluded = [check for check in ALL_CHECKS if check.__name__ in left_out]
        case.call_and_validate(headers=headers, excluded_checks=excluded)
        return
    response = case.call(headers=headers)
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
def test_every_check_holds_for_an_operator(case: Any, stage: Stage, _requests_share_the_test_transaction: None) -> None:
    _fuzz(case, stage, "operator", every_check=True)


@pytest.mark.slow  # the operator's pass covers every operation in the fast lane; this one, the viewer's refusals
@pytest.mark.timeout(120)
@schema.parametrize()
@FUZZ
def test_it_never_answers_500_to_a_viewer(case: Any, stage: Stage, _requests_share_the_test_transaction: None) -> None:
    _fuzz(case, stage, "viewer", every_check=False)
