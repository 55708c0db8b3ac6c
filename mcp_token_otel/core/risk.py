"""Risk tiers for a message's token count, and the advisories a user should read about them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

RiskTier = Literal["low", "medium", "high", "critical"]
RISK_TIERS: tuple[RiskTier, ...] = ("low", "medium", "high", "critical")
#: Tiers that count as a breach (alerting, span events).
BREACH_TIERS: frozenset[str] = frozenset({"high", "critical"})
DEFAULT_MAX_OVERHEAD_RATIO = 0.3


@dataclass(frozen=True, slots=True)
class RiskThresholds:
    """Upper bounds (inclusive) of the low, medium and high tiers; anything above ``high`` is critical."""

    low: int = 1000
    medium: int = 4000
    high: int = 8000

    def __post_init__(self) -> None:
        for name in ("low", "medium", "high"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"risk.thresholds.{name}: expected a positive integer, got {value!r}")
        if not self.low < self.medium < self.high:
            raise ValueError(
                "risk.thresholds: expected strictly increasing low < medium < high, "
                f"got low={self.low}, medium={self.medium}, high={self.high}"
            )

    @classmethod
    def coerce(cls, value: RiskThresholds | Mapping[str, int] | Sequence[int] | None) -> RiskThresholds:
        """Accept thresholds as an instance, a mapping {low, medium, high} or a 3-sequence."""
        if value is None:
            return DEFAULT_THRESHOLDS
        if isinstance(value, RiskThresholds):
            return value
        if isinstance(value, Mapping):
            unknown = set(value) - {"low", "medium", "high"}
            if unknown:
                raise ValueError(f"risk.thresholds: unknown keys {sorted(unknown)}, expected low, medium, high")
            return cls(**value)
        items = list(value)
        if len(items) != 3:
            raise ValueError(f"risk.thresholds: expected 3 values (low, medium, high), got {len(items)}")
        return cls(*items)


DEFAULT_THRESHOLDS = RiskThresholds()


def classify_risk(
    tokens: int, thresholds: RiskThresholds | Mapping[str, int] | Sequence[int] | None = None
) -> RiskTier:
    """The tier of a token count: low <= 1000 < medium <= 4000 < high <= 8000 < critical by default."""
    return tier_of(tokens, RiskThresholds.coerce(thresholds))


def tier_of(tokens: int, t: RiskThresholds) -> RiskTier:
    """classify_risk for thresholds already validated (the per-message path)."""
    if tokens <= t.low:
        return "low"
    if tokens <= t.medium:
        return "medium"
    if tokens <= t.high:
        return "high"
    return "critical"


def risk_advisory(tier: str, tokens: int, subject: str) -> str | None:
    """What to do about a high or critical response; None for lower tiers."""
    if tier == "critical":
        return (
            f"{subject} returned {tokens:,} tokens (critical): a response this large can evict system "
            "instructions from the context window; paginate, filter or truncate it."
        )
    if tier == "high":
        return (
            f"{subject} returned {tokens:,} tokens (high): consider a limit or pagination parameter "
            "before it grows into the critical tier."
        )
    return None


def overhead_advisory(
    overhead_tokens: int, ratio: float, max_ratio: float = DEFAULT_MAX_OVERHEAD_RATIO
) -> str | None:
    """A warning when non-data overhead (_meta, annotations, duplicated structuredContent) is too large."""
    if ratio <= max_ratio:
        return None
    return (
        f"Overhead is {ratio:.0%} of the message ({overhead_tokens:,} tokens), above the {max_ratio:.0%} "
        "limit: drop _meta and annotations the model does not need, or structuredContent that duplicates "
        "a text block."
    )
