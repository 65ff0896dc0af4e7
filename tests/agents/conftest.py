"""The fake model servers, and the live stack's worker configured to call them."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings

from tests.agents.fakes import FakeServer
from tests.conftest import (
    LiveStack,
    Team,
    assert_test_database,  # noqa: E402,F401 - re-exported for this package's fixtures
)

OPENAI_KEY = "sk-fake-openai"
ANTHROPIC_KEY = "sk-ant-fake"


@pytest.fixture(scope="session")
def fakes() -> Iterator[dict[str, FakeServer]]:
    servers = {"openai": FakeServer("openai", api_key=OPENAI_KEY), "anthropic": FakeServer("anthropic", api_key=ANTHROPIC_KEY)}
    try:
        yield servers
    finally:
        for server in servers.values():
            server.close()


def providers_config(fakes: dict[str, FakeServer]) -> dict[str, Any]:
    openai_entry = {"api": "openai", "base_url": fakes["openai"].url, "api_key": OPENAI_KEY, "timeout": 10}
    return {
        "openai": openai_entry,
        "fakeai": openai_entry,
        "fakeant": {
            "api": "anthropic",
            "base_url": fakes["anthropic"].url,
            "api_key": ANTHROPIC_KEY,
            "timeout": 10,
            "max_tokens": 512,
        },
        "badkey": {**openai_entry, "api_key": "sk-wrong"},
    }


@pytest.fixture
def provider_live(live: LiveStack, fakes: dict[str, FakeServer]) -> Iterator[LiveStack]:
    """The live stack whose worker reads OZ0_PROVIDERS pointing at the fake servers
    (restarted once when an earlier module started it without them)."""
    assert_test_database()
    config = json.dumps(providers_config(fakes), sort_keys=True)
    if live.env.get("OZ0_PROVIDERS") != config:
        live.env["OZ0_PROVIDERS"] = config
        os.environ["OZ0_PROVIDERS"] = config
        live.kill_worker()
        live.start_worker()
    settings.OZ0_PROVIDERS = json.loads(config)
    yield live


@pytest.fixture
def provider_team(provider_live: LiveStack) -> Team:
    return Team()
