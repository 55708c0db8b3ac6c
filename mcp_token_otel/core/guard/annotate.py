"""Token annotation: the estimate of a result in its ``_meta``, so an agent can budget before reading it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The project's ``_meta`` namespace (reverse DNS of github.com/mcp-token-otel, per the MCP _meta key rules).
META_PREFIX = "io.github.mcp-token-otel/"
#: {"tokens": int, "tier": "low|medium|high|critical", "estimator": name}, plus "originalTokens" after a cut.
META_TOKENS_KEY = META_PREFIX + "tokens"
#: On a refusal made by a guard: {"policy": ..., and the numbers}.
META_GUARD_KEY = META_PREFIX + "guard"


def annotate(result: Mapping[str, Any], value: Mapping[str, Any], key: str = META_TOKENS_KEY) -> dict[str, Any] | None:
    """A copy of ``result`` with ``value`` at ``_meta[key]``; None (no change) when the server already uses
    that key or its ``_meta`` is not an object: a server's own keys are never overwritten."""
    meta = result.get("_meta")
    if meta is None:
        meta = {}
    elif not isinstance(meta, Mapping) or key in meta:
        return None
    return {**result, "_meta": {**meta, key: dict(value)}}
