"""What billed tokens cost: the prices of `genai-prices` (installed with oz0, read offline from its
own snapshot), per model, in US dollars.

A model call's trace event (`provider_call`) names its route (`openai:gpt-4o` of oz0's own loop) or
its model and provider (a framework's request in a harnessed round). A model the price list does
not know (a scripted or test model, a private deployment's name) has no cost: it is listed as
unpriced rather than counted as free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from functools import lru_cache
from typing import Any

from genai_prices import Usage, calc_price

CENT_DIGITS = Decimal("0.000001")


def model_of(call: Mapping[str, Any]) -> tuple[str, str | None]:
    """(model, provider) of a provider call's event data: its `model` (and `provider`) when it
    names them, else its route `provider:model`."""
    model = call.get("model")
    if isinstance(model, str) and model:
        provider = call.get("provider")
        return model, provider if isinstance(provider, str) and provider else None
    route = str(call.get("route") or "")
    provider, _, name = route.partition(":")
    return (name, provider or None) if name else (route, None)


def price(model: str, provider: str | None, input_tokens: int, output_tokens: int) -> Decimal | None:
    """The cost of these tokens on this model, or None when the price list does not know it."""
    if not model or (input_tokens <= 0 and output_tokens <= 0):
        return Decimal(0) if model and _known(model, provider) else None
    try:
        found = calc_price(Usage(input_tokens=input_tokens, output_tokens=output_tokens), model, provider_id=provider)
    except LookupError:
        if provider is None:
            return None
        # The provider's name is the installer's (OZ0_PROVIDERS); the model's may still be known.
        return price(model, None, input_tokens, output_tokens)
    return Decimal(found.total_price)


@lru_cache(maxsize=512)
def _known(model: str, provider: str | None) -> bool:
    try:
        calc_price(Usage(input_tokens=1, output_tokens=1), model, provider_id=provider)
    except LookupError:
        return provider is not None and _known(model, None)
    return True


def usage_cost(rows: Iterable[tuple[str, str | None, int, int, int]]) -> dict[str, Any]:
    """Tokens and cost of (model, provider, input_tokens, output_tokens, calls) rows: the totals,
    the cost in dollars (as text, to six places) of the priced ones, and the unpriced models.

    Each model's tokens are priced together (a price lookup takes milliseconds; a run may make
    thousands of calls): a tiered price (one that rises past a context size) is then read at the
    model's total, not per call, so it may be over-counted."""
    total = {"input_tokens": 0, "output_tokens": 0, "calls": 0}
    by_model: dict[tuple[str, str | None], list[int]] = {}
    for model, provider, input_tokens, output_tokens, calls in rows:
        total["input_tokens"] += int(input_tokens)
        total["output_tokens"] += int(output_tokens)
        total["calls"] += int(calls)
        tokens = by_model.setdefault((model, provider), [0, 0])
        tokens[0] += int(input_tokens)
        tokens[1] += int(output_tokens)
    cost = Decimal(0)
    priced = False
    unpriced: set[str] = set()
    for (model, provider), (input_tokens, output_tokens) in by_model.items():
        amount = price(model, provider, input_tokens, output_tokens)
        if amount is None:
            unpriced.add(model or "unknown")
        else:
            cost += amount
            priced = True
    return {
        **total,
        "cost_usd": str(cost.quantize(CENT_DIGITS)) if priced else None,
        "unpriced_models": sorted(unpriced),
    }
