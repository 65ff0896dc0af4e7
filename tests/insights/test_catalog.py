"""F1, F9, F10, F13: one failure vocabulary, the catalog and the OpenAPI document's x-oz0-failures."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from openapi_spec_validator import validate

from oz0agents.models import AgentVersion
from runs import failures
from tests.insights.planting import make_agent

pytestmark = pytest.mark.django_db

# SPEC.md, "Decision — the flags of the platform kinds": (retryable, partial, person).
SPEC_FLAGS = {
    "timeout": (True, True, False),
    "budget": (False, True, True),
    "limit": (False, True, False),
    "outcome_not_met": (True, False, False),
    "best_of_no_pick": (True, False, False),
    "unknown_outcome": (False, True, True),
    "denied": (False, True, False),
    "refused": (False, True, True),
    "invalid_input": (False, False, False),
    "unavailable": (True, True, False),
    "model": (True, True, False),
    "tool_failed": (False, True, False),
    "cancelled": (False, True, False),
    "undeclared": (False, True, False),
    "error": (True, True, False),
}


@pytest.mark.spec("F9")
def test_it_gives_every_platform_kind_the_flags_of_the_spec_table() -> None:
    assert list(failures.PLATFORM_KINDS) == list(SPEC_FLAGS)
    assert {k: (v.retryable, v.partial, v.person) for k, v in failures.PLATFORM_KINDS.items()} == SPEC_FLAGS


@pytest.mark.spec("F1", "F9")
def test_it_maps_every_error_key_to_a_platform_kind() -> None:
    assert set(failures.ERROR_KEY_KINDS.values()) <= set(failures.PLATFORM_KINDS)
    assert set(failures.ERROR_KEYS) <= set(failures.ERROR_KEY_KINDS)
    assert failures.kind_for_error_key("never_heard_of_it") == "error"
    assert failures.kind_for_error_key(None) == "error"


@pytest.mark.spec("F1", "F10")
def test_it_always_gives_a_failure_its_kind_flags_message_and_declared() -> None:
    for kind in failures.PLATFORM_KINDS:
        failure = failures.platform_failure(kind, "why")
        assert set(failure) == {"kind", "retryable", "partial", "person", "message", "declared"}
        assert failure["declared"] is False
    declared = failures.declared_failure({"kind": "not_found", "person": True}, "gone")
    assert declared == {
        "kind": "not_found",
        "retryable": False,
        "partial": False,
        "person": True,
        "message": "gone",
        "declared": True,
    }


@pytest.mark.spec("F9", "F13")
def test_it_lists_agents_with_their_failures_and_the_platform_kinds(team: Any) -> None:
    make_agent("cataloged", workspace=team.workspace, versions=2, kinds=("not_found", "tracker_busy"))
    status, body = team.api("viewer").get("/catalog")
    assert status == 200
    [agent] = [a for a in body["agents"] if a["name"] == "cataloged"]
    assert agent["version"] == 2 and agent["workspace"] == team.slug
    assert [f["kind"] for f in agent["failures"]] == ["not_found", "tracker_busy"]
    assert agent["failures"][0] == {
        "kind": "not_found",
        "description": "not_found happened",
        "retryable": False,
        "partial": False,
        "person": True,
    }
    platform = {k["kind"]: k for k in body["platform_kinds"]}
    assert {k: (v["retryable"], v["partial"], v["person"]) for k, v in platform.items()} == SPEC_FLAGS
    assert all(v["when"] for v in platform.values())
    status, body = Client().get("/api/v1/catalog"), None
    assert status.status_code == 401


@pytest.mark.spec("F13")
def test_it_puts_each_agents_kinds_in_the_openapi_document(team: Any) -> None:
    make_agent("documented", workspace=team.workspace, kinds=("not_found",))
    status, document = team.api("viewer").get("/openapi.json")
    assert status == 200
    validate(document)
    assert document["x-oz0-failures"]["documented"] == ["not_found"]
    assert document["info"]["x-oz0-failures"]["documented"] == ["not_found"]
    # Computed at request time: a new version's kinds show at once.
    latest = AgentVersion.objects.get(agent__name="documented")
    manifest = {**latest.manifest, "failures": [*latest.manifest["failures"], {"kind": "quota_gone", "description": "d"}]}
    AgentVersion.objects.create(agent=latest.agent, version=2, manifest_text="x", manifest=manifest, digest="d2")
    status, document = team.api("viewer").get("/openapi.json")
    validate(document)
    assert document["x-oz0-failures"]["documented"] == ["not_found", "quota_gone"]
    paths = document["paths"]
    assert {"/api/v1/findings", "/api/v1/catalog", "/api/v1/insights/agents/{agent}"} <= set(paths)
