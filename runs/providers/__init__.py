"""Model providers behind one interface.

A provider makes one attempt: `complete(request)` returns a `ProviderAnswer` or raises
`AttemptFailed` describing what the provider said. Classifying attempts into error keys,
waiting out rate limits and advancing to fallbacks is `runs.rounds`' job, the same for
every provider.
"""

from __future__ import annotations

from runs.providers.base import AttemptFailed, Provider, ProviderAnswer, ProviderRequest, get_provider, route_provider_name

__all__ = ["AttemptFailed", "Provider", "ProviderAnswer", "ProviderRequest", "get_provider", "route_provider_name"]
