"""Model providers behind one interface.

A provider makes one attempt: `complete(request)` returns a `ProviderAnswer` or raises
`AttemptFailed` describing what the provider said. Classifying attempts into error keys,
waiting out rate limits and advancing to fallbacks is the round driver's job
(`runs.worker.round_driver`), the same for every provider.

`get_provider` picks the provider a route names: `script` (the scripted test provider), or an
entry of `settings.OZ0_PROVIDERS` speaking the OpenAI or the Anthropic API.
"""

from __future__ import annotations

from collections.abc import Mapping

from django.conf import settings

from runs.worker.providers.anthropic import AnthropicProvider
from runs.worker.providers.base import AttemptFailed, Provider, ProviderAnswer, ProviderRequest, route_provider_name
from runs.worker.providers.openai import OpenAIProvider
from runs.worker.providers.script import ScriptProvider

APIS = ("openai", "anthropic")

__all__ = ["AttemptFailed", "Provider", "ProviderAnswer", "ProviderRequest", "get_provider", "route_provider_name"]


def get_provider(route: str) -> Provider:
    name = route_provider_name(route)
    if name == "script":
        return ScriptProvider()
    config = dict(getattr(settings, "OZ0_PROVIDERS", {}) or {}).get(name)
    if not isinstance(config, Mapping):
        raise AttemptFailed("http", f"no provider named {name!r} is configured", http_status=404)
    api = str(config.get("api") or name)
    if api == "openai":
        return OpenAIProvider(name, config)
    if api == "anthropic":
        return AnthropicProvider(name, config)
    raise AttemptFailed("http", f"provider {name!r} speaks {api!r}; oz0 speaks {', '.join(APIS)}", http_status=404)
