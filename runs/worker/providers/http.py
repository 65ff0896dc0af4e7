"""HTTP providers (OpenAI Chat Completions, Anthropic Messages), configured per route.

A route `openai:gpt-4o-mini` names the provider entry `openai` of `settings.OZ0_PROVIDERS`
and the model `gpt-4o-mini`. An entry holds `base_url`, `api_key`, and optionally `api`
(`openai` or `anthropic`, when the entry's name is not the API's, e.g. a local
OpenAI-compatible server), `timeout` and `max_tokens`.

What both providers share lives here: the HTTP exchange (one attempt, no client retries),
Retry-After parsing, tool-name encoding (the APIs refuse dots), and the built-in tools.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
from django.utils import timezone

from runs.worker.providers.base import AttemptFailed

DEFAULT_TIMEOUT = 120.0

# A model question: the built-in tool every HTTP round offers (S9, S20).
ASK_TOOL = {
    "name": "oz.ask",
    "description": "Ask the person a question and wait for their answer before going on",
    "parameters": {"type": "object", "properties": {"question": {"type": "string"}}, "required": ["question"]},
}


class HttpProvider:
    """One configured endpoint. Subclasses build the request and read the answer."""

    name: str

    def __init__(self, name: str, config: Mapping[str, Any]) -> None:
        self.name = name
        self.base_url = str(config.get("base_url") or "").rstrip("/")
        self.api_key = str(config.get("api_key") or "")
        self.timeout = float(config.get("timeout") or DEFAULT_TIMEOUT)
        # Anthropic requires a bound on the answer's length; Chat Completions only sends one when configured.
        self.max_tokens_configured = config.get("max_tokens") is not None
        self.max_tokens = int(config.get("max_tokens") or 4096)
        # A lane without tool calls (e.g. a plain completion server): a round that declares tools cannot use it.
        self.tool_calls = config.get("tool_calls", True) is not False
        if not self.base_url:
            raise AttemptFailed("http", f"provider {name!r} has no base_url", http_status=404)

    def client(self) -> httpx.Client:
        # One attempt per call: the round owns retries and budgets, so the client makes none.
        return httpx.Client(timeout=httpx.Timeout(self.timeout, connect=min(self.timeout, 10.0)), follow_redirects=False)


def retry_after(headers: httpx.Headers) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), or the retry-after-ms header."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return max(0.0, float(raw_ms) / 1000.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - timezone.now()).total_seconds())


def error_body(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    error = body.get("error") if isinstance(body, Mapping) else None
    return dict(error) if isinstance(error, Mapping) else {}


def http_failure(response: httpx.Response, detail: str = "") -> AttemptFailed:
    return AttemptFailed(
        "http",
        detail or f"HTTP {response.status_code}",
        http_status=response.status_code,
        retry_after=retry_after(response.headers),
    )


_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def encode_tool(name: str) -> str:
    """The APIs take `^[a-zA-Z0-9_-]{1,64}$`: `test.echo` travels as `test__echo`."""
    return name.replace(".", "__")


def decode_tool(name: str) -> str:
    return name.replace("__", ".")


def call_id(key: str) -> str:
    """A tool call's id on the wire, from the key of the task that runs it (`r1.2` → `oz_r1_2`)."""
    return "oz_" + _UNSAFE.sub("_", key)


def with_builtins(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if any(t.get("name") == "oz.ask" for t in tools):
        return tools
    return [*tools, ASK_TOOL]


def parse_arguments(raw: Any, tool: str, usage: dict[str, int]) -> dict[str, Any]:
    """A tool call's arguments: a JSON object, else the answer is malformed (a typed round failure)."""
    if isinstance(raw, Mapping):
        return dict(raw)
    if raw is None or raw == "":
        return {}
    try:
        value = json.loads(raw)
    except (TypeError, ValueError) as error:
        raise AttemptFailed("malformed", f"the arguments of the call to {tool!r} are not JSON: {error}", usage=usage) from None
    if not isinstance(value, Mapping):
        raise AttemptFailed("malformed", f"the arguments of the call to {tool!r} are not a JSON object", usage=usage)
    return dict(value)


def ask_question(args: Mapping[str, Any]) -> str:
    question = args.get("question")
    return question if isinstance(question, str) else json.dumps(args, sort_keys=True)
