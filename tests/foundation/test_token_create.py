"""`./oz0 token create USER --workspace WS --role ROLE` prints a working bearer token."""

from __future__ import annotations

import hashlib
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from tenancy.models import ApiToken, Membership, Workspace
from tests.conftest import Api, _database_url
from tests.foundation.helpers import clean_env, oz0


@pytest.mark.usefixtures("committed")
def test_it_prints_a_working_token_on_its_last_line(tmp_path: Any) -> None:
    from django.conf import settings

    env = clean_env(DATABASE_URL=_database_url(), REDIS_URL=settings.REDIS_URL, OZ0_DATA_DIR=str(tmp_path))
    result = oz0("token", "create", "robot", "--workspace", "tokens-ws", "--role", "operator", env=env)
    assert result.returncode == 0, result.stderr
    token = result.stdout.strip().splitlines()[-1]

    status, body = Api(token).get("/workspaces/tokens-ws/runs")
    assert status == 200, body
    status, body = Api(token).post("/workspaces/tokens-ws/runs", {"tasks": [{"key": "a", "kind": "tool", "tool": "clock.now"}]})
    assert status == 201, body  # an operator: write standing

    stored = ApiToken.objects.get(user__username="robot")
    assert stored.digest == hashlib.sha256(token.encode()).hexdigest()
    assert token not in {stored.digest, stored.label}


@pytest.mark.django_db
def test_it_sets_the_role_of_an_existing_member() -> None:
    out = StringIO()
    call_command("token_create", "sam", "--workspace", "roles-ws", "--role", "operator", stdout=out)
    call_command("token_create", "sam", "--workspace", "roles-ws", "--role", "viewer", stdout=out)
    workspace = Workspace.objects.get(slug="roles-ws")
    assert Membership.objects.get(workspace=workspace, user__username="sam").role == "viewer"
    tokens = [line for line in out.getvalue().splitlines() if " " not in line]
    assert len(tokens) == 2 and tokens[0] != tokens[1]
    status, _ = Api(tokens[1]).post("/workspaces/roles-ws/runs", {"tasks": [{"key": "a", "kind": "tool", "tool": "clock.now"}]})
    assert status == 403  # a viewer now


@pytest.mark.django_db
@pytest.mark.parametrize(
    "args",
    [
        ["sam", "--workspace", "not a slug", "--role", "viewer"],
        ["sam", "--workspace", "ws", "--role", "admin"],
        ["sam", "--role", "viewer"],
    ],
)
def test_it_refuses_bad_arguments_and_changes_nothing(args: list[str]) -> None:
    # Counted, not "none at all": a committed-data test on the same xdist worker leaves its token.
    tokens_before = ApiToken.objects.count()
    with pytest.raises((CommandError, SystemExit)):
        call_command("token_create", *args, stdout=StringIO(), stderr=StringIO())
    assert ApiToken.objects.count() == tokens_before
    assert not ApiToken.objects.filter(user__username="sam").exists()
    assert not Workspace.objects.filter(slug__in=["ws", "not a slug"]).exists()
