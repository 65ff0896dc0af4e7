"""Client awaits' resolution tokens: write standing to resolve (S32), stored hashed, accepted in the body (S8)."""

from __future__ import annotations

import hashlib

import pytest

from runs.models import Task
from tests.conftest import Team


def _await_run(team: Team) -> tuple[str, str]:
    body = {"tasks": [{"key": "q", "kind": "await", "question": "Ship it?"}], "deliverable": "q"}
    status, created = team.api().post(f"/workspaces/{team.slug}/runs", body)
    assert status == 201, created
    return created["run"]["id"], created["receipt"]["tokens"]["q"]


@pytest.mark.spec("S32", "S8")
@pytest.mark.parametrize("role,status", [("outsider", 404), ("viewer", 403), ("reader", 403), ("operator", 200)])
def test_it_needs_write_standing_to_resolve_an_await(team: Team, role: str, status: int) -> None:
    """Before, the token alone resolved the await: a viewer (or anyone) holding it wrote to the run."""
    run_id, token = _await_run(team)
    got, body = team.api(role).post("/awaits", {"token": token, "value": "yes"})
    assert got == status, body
    task = Task.objects.get(run_id=run_id, key="q")
    if status == 200:
        assert body["run"]["status"] == "completed" and task.status == "completed" and task.result == {"value": "yes"}
    else:
        assert body["error"]["key"] in ("not_found", "forbidden")
        assert task.status == "dispatched"
        got, _ = team.api(role).post(f"/awaits/{token}", {"value": "yes"})
        assert got == status
        assert Task.objects.get(pk=task.pk).status == "dispatched"


@pytest.mark.spec("S8")
def test_it_stores_only_the_tokens_digest(team: Team) -> None:
    run_id, token = _await_run(team)
    stored = Task.objects.get(run_id=run_id, key="q").resolution_token
    assert stored != token and stored == hashlib.sha256(token.encode()).hexdigest()
    # The digest itself is no proof.
    status, body = team.api().post("/awaits", {"token": stored, "value": 1})
    assert status == 404 and body["error"]["key"] == "not_found"


def test_it_still_accepts_the_token_in_the_path(team: Team) -> None:
    run_id, token = _await_run(team)
    status, body = team.api().post(f"/awaits/{token}", {"value": "ok"})
    assert status == 200 and body["run"]["status"] == "completed"
    status, body = team.api().post("/awaits", {"token": token, "value": "again"})
    assert status == 409 and body["error"]["key"] == "not_pending"


def test_it_refuses_bad_bodies_typed(team: Team) -> None:
    run_id, token = _await_run(team)
    api = team.api()
    # The kernel's shape (RESOLVE_BODY) refuses them with its own key, naming the field.
    for body in ({"value": 1}, {"token": 5}, {"token": None}):
        status, answer = api.post("/awaits", body)
        assert (status, answer["error"]["key"]) == (400, "invalid_field") and "`token`" in answer["error"]["detail"], body
    status, answer = api.post("/awaits", {"token": "t" * 50_000})
    assert status == 404 and answer["error"]["key"] == "not_found"
    status, answer = api.post("/awaits", raw="{oops")
    assert status == 400 and "key" in answer["error"]
    status, answer = api.post("/awaits", {"token": token, "value": "x" * (2 * 1024 * 1024)})
    assert status == 413
    status, answer = api.post("/awaits", {"token": token, "value": "nul\u0000"})
    assert status == 400
    assert Task.objects.get(run_id=run_id, key="q").status == "dispatched"


def test_it_hashes_tokens_issued_before_the_migration() -> None:
    import importlib

    migration = importlib.import_module("runs.migrations.0005_hash_await_resolution_tokens")

    class Rows:
        updates: list[tuple[int, str]] = []

        def filter(self, **kwargs: object) -> Rows:
            self.last = kwargs
            return self

        def values_list(self, *fields: str) -> Rows:
            return self

        def iterator(self) -> list[tuple[int, str]]:
            return [(1, "plain-token")]

        def update(self, **kwargs: str) -> None:
            Rows.updates.append((int(str(self.last["pk"])), kwargs["resolution_token"]))

    class Model:
        objects = Rows()

    class Apps:
        def get_model(self, app: str, name: str) -> type[Model]:
            return Model

    migration.hash_tokens(Apps(), None)
    assert Rows.updates == [(1, hashlib.sha256(b"plain-token").hexdigest())]
