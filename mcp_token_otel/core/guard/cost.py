"""Cost of a response entering a model's context, from a price table in USD per million input tokens."""

from __future__ import annotations

from collections.abc import Mapping


def cost_usd(tokens: int, model: str, pricing: Mapping[str, float]) -> float | None:
    """Estimated USD for ``tokens`` input tokens of ``model``; None when no model or no price is known."""
    price = pricing.get(model) if model else None
    if price is None or tokens <= 0:
        return None if price is None else 0.0
    return tokens * price / 1_000_000
