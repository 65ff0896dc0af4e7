"""A fuzz pass over the OpenAPI document with schemathesis: whatever a client sends to any
operation it describes, oz0 answers below 500 (bad input gets a typed 4xx, never a crash), and
as an operator every schemathesis check holds (issue 27.8): what the document calls valid is
accepted, what it calls invalid refused, statuses, headers and bodies as documented.

Runs in-process against the WSGI app on the test database, with a bounded number of examples per
operation (and schemathesis's coverage cases) so each operation's pass takes seconds on 2 cores.

Every operation runs every check. Where a rule is one JSON Schema cannot state (a run's tasks are
a program, a manifest is YAML the linter reads, an executor's tools are the catalog's, a findings
query is a language), the positive cases are made valid by `tests.foundation.fuzz_valid` from what
schemathesis generated, and checked still valid against the document's schema before they are
sent; the negative cases go as generated.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
import schemathesis
from django.contrib.auth.models import User
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, settings
from jsonschema import Draft202012Validator
from ninja.responses import NinjaJSONEncoder
from schemathesis.generation.meta import ParameterLocation, TestPhase
from schemathesis.specs.openapi.checks import ignored_auth

from runs import idempotency
from runs.models import Run, Task
from tenancy.models import Membership
from tests.conftest import Api
from tests.factories import make_token, make_workspace, unique
from tests.foundation import fuzz_valid
from tests.runs.driver import drive, echo, fail

EXAMPLES_PER_OPERATION = int(os.environ.get("OZ0_FUZZ_EXAMPLES", "3"))
# A guard against a hang, not a speed check: the create operation's few hundred coverage cases ran
# past 120 s on a machine loaded by the other lanes.
FUZZ_TIME_LIMIT = 600


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

    document = json.loads(json.dumps(NinjaAPI.get_openapi_schema(api, path_prefix="/api/v1/"), cls=NinjaJSONEncoder))
    loaded = schemathesis.openapi.from_dict(document)
    loaded.app = get_wsgi_application()
    return document, loaded


DOCUMENT, schema = _load_schema()


def _assert_fits_the_document(case: Any) -> None:
    body_schema = DOCUMENT["paths"][case.operation.path][case.operation.method.lower()]["requestBody"]["content"]
    validator = Draft202012Validator(
        {**body_schema["application/json"]["schema"], "components": DOCUMENT["components"]},
        format_checker=Draft202012Validator.FORMAT_CHECKER,
    )
    problems = [error.message for error in validator.iter_errors(case.body)]
    assert not problems, f"a mapped positive body the document calls invalid: {problems[:3]}"


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


_cases = itertools.count(1)


def _made_valid(case: Any, stage: Stage) -> None:
    """A positive case's rules beyond the schema made to hold (`fuzz_valid`), and the result held
    to the schema: a mapper that left it would prove nothing about the document."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return
    if isinstance(case.headers, MutableMapping) and isinstance(case.headers.get(idempotency.HEADER), str):
        # A key another example already sent with another body is a 409 by design, which would
        # answer the case before its body is judged: each positive case's key is its own.
        case.headers[idempotency.HEADER] = f"{case.headers[idempotency.HEADER][:200]}-{next(_cases)}"
    operation = (case.operation.method.upper(), case.operation.path.removeprefix("/api/v1"))
    body = case.body if isinstance(case.body, dict) else None
    if operation == ("GET", "/findings") and isinstance(case.query, dict) and "q" in case.query:
        case.query["q"] = fuzz_valid.query(case.query["q"])  # any text is a `q` as the document says
        return
    if operation == ("GET", "/insights/agents/{agent}/numbers") and isinstance(case.query, dict):
        case.query = fuzz_valid.numbers_range(case.query, datetime.now(UTC).date())
        return
    if body is None:
        return
    if operation == ("POST", "/workspaces/{ws}/runs"):
        case.body = fuzz_valid.create_body(body)
    elif operation == ("POST", "/runs/{run_id}/append"):
        taken = Task.objects.filter(run_id__in=[stage.run_id, stage.held_run_id]).values_list("key", flat=True)
        case.body = fuzz_valid.append_body(body, taken)
    elif operation in (("POST", "/agents"), ("POST", "/workspaces/{ws}/agents"), ("POST", "/agents/lint")):
        case.body = fuzz_valid.manifest(body)
    elif operation == ("POST", "/executors"):
        case.body = fuzz_valid.executor(body)
    elif operation in (("POST", "/workspaces/{ws}/schedules"), ("PATCH", "/workspaces/{ws}/schedules/{schedule_id}")):
        case.body = fuzz_valid.schedule(body, next(_cases), create=operation[0] == "POST")
    elif operation == ("POST", "/workspaces/{ws}/triggers"):
        case.body = fuzz_valid.trigger(body, next(_cases))
    elif operation in (("POST", "/workspaces/{ws}/walls"), ("PUT", "/workspaces/{ws}/walls/{wall_id}")):
        case.body = fuzz_valid.wall(body, next(_cases), create=operation[0] == "POST")
    elif operation in (
        ("POST", "/workspaces/{ws}/approver-groups"),
        ("PUT", "/workspaces/{ws}/approver-groups/{approver_group_id}"),
    ):
        case.body = fuzz_valid.approver_group(body, next(_cases), create=operation[0] == "POST")
    elif operation == ("PUT", "/workspaces/{ws}/wait-deadlines"):
        case.body = fuzz_valid.wait_deadlines(body)
    else:
        return
    _assert_fits_the_document(case)


def _fuzz(case: Any, stage: Stage, role: str, *, every_check: bool) -> None:
    _tamed(case)
    _made_valid(case, stage)
    if _only_an_optional_body_left_out(case):
        # The document says the body is optional: a case "made invalid" by leaving it out is
        # valid, and its answer proves no 5xx only.
        every_check = False
    if not _a_made_up_path_only_finds_nothing(case):
        _call(case, stage.tokens[role], every_check=every_check)
    if case.path_parameters:
        negative_elsewhere = _negative_beyond_the_path(case)
        case.path_parameters = stage.path_parameters(case.path_parameters)
        # A case whose only invalid part was its path is valid once the path names real things:
        # its second call proves no 5xx, not a refusal of data it no longer holds.
        every_check = every_check and negative_elsewhere is not False
    token = stage.executor_token if "/executors/{executor_id}" in case.operation.path else stage.tokens[role]
    _call(case, token, every_check=every_check)


def _a_made_up_path_only_finds_nothing(case: Any) -> bool:
    """A coverage case whose path is well formed but names nothing real: its first call is a 404
    (or 403) answered before the body is read, the same answer for each of the hundreds of bodies
    and queries the coverage phase varies, so only its second call, on real objects, is sent. Cases
    of the fuzzing phase, and cases that vary the path itself, still make both calls."""
    meta = case.meta
    if not case.path_parameters or meta is None or meta.phase.name != TestPhase.COVERAGE:
        return False
    path = meta.components.get(ParameterLocation.PATH)
    varied = getattr(meta.phase.data, "parameter_location", None)
    return path is not None and path.mode.is_positive and varied not in (ParameterLocation.PATH, None)


def _only_an_optional_body_left_out(case: Any) -> bool:
    meta = case.meta
    if meta is None or meta.generation.mode.is_positive:
        return False
    negative = {where for where, info in meta.components.items() if not info.mode.is_positive}
    body = case.operation.definition.raw.get("requestBody") or {}
    left_out = not isinstance(case.body, dict | list | str | int | float | bool)
    return negative <= {ParameterLocation.BODY} and left_out and not body.get("required", False)


def _negative_beyond_the_path(case: Any) -> bool | None:
    """For a negative case, whether a part other than its path was made invalid (None: a positive case)."""
    meta = case.meta
    if meta is None or meta.generation.mode.is_positive:
        return None
    return any(not info.mode.is_positive for where, info in meta.components.items() if where != ParameterLocation.PATH)


# The operations whose refusal of a request without credentials, or with wrong ones, was seen
# (schemathesis's runner keeps this set per run: "enforcement is a property of the operation, so
# one confirmation per run is enough"; called from pytest, its check gets no such set and probed
# three times again for every case, 3,748 of the operator pass's 8,876 requests).
_AUTH_ENFORCED: set[str] = set()


def _ignored_auth_once_per_operation(ctx: Any, response: Any, case: Any) -> bool | None:
    ctx.auth_enforced_operations = _AUTH_ENFORCED
    return ignored_auth(ctx, response, case)  # type: ignore[no-any-return]


def _call(case: Any, token: str, *, every_check: bool) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    if every_check:
        case.call_and_validate(
            headers=headers, excluded_checks=[ignored_auth], additional_checks=[_ignored_auth_once_per_operation]
        )
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


# One test an operation, run once for each role: collecting the module builds each operation's
# schemathesis test, its coverage cases included, in every xdist worker of the rest lane, and a
# test a role built each twice (the module's collection 4.9 s of CPU, 3.8 s built once). Both
# roles run the same derandomized cases, as the two tests did.
@pytest.mark.thorough
@pytest.mark.timeout(FUZZ_TIME_LIMIT)
@pytest.mark.parametrize("role", ["operator", "viewer"])
@schema.parametrize()
@FUZZ
def test_every_check_holds_for_an_operator_and_a_viewer_never_gets_a_500(
    case: Any, stage: Stage, _requests_share_the_test_transaction: None, role: str
) -> None:
    _fuzz(case, stage, role, every_check=role == "operator")
