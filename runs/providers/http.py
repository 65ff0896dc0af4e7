"""HTTP providers (OpenAI Chat Completions, Anthropic Messages) are configured per route."""

from __future__ import annotations

from runs.providers.base import AttemptFailed, Provider


def provider_for(name: str) -> Provider:
    raise AttemptFailed("http", f"no provider named {name!r} is configured", status=404)
