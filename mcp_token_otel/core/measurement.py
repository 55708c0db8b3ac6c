"""What a measurement is: the :class:`Policy` it follows, the :class:`Measurement` of one message and its
:class:`Block` parts, and the :class:`Builder` that adds blocks up into one. Rules: :mod:`.measure`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from .estimation import estimate_tokens
from .media import DEFAULT_IMAGE_RULE, ImageRule
from .payload import ZERO, Estimator, Size, size_text, size_value
from .risk import (
    BREACH_TIERS,
    DEFAULT_MAX_OVERHEAD_RATIO,
    DEFAULT_THRESHOLDS,
    RiskThresholds,
    RiskTier,
    overhead_advisory,
    risk_advisory,
    tier_of,
)

Direction = Literal["input", "output"]


@dataclass(frozen=True, slots=True)
class Policy:
    """How messages are measured and judged: the estimator, image rule, tier thresholds, overhead limit."""

    estimator: Estimator = estimate_tokens
    estimator_name: str = "default"
    thresholds: RiskThresholds = DEFAULT_THRESHOLDS
    max_overhead_ratio: float = DEFAULT_MAX_OVERHEAD_RATIO
    #: How an image block is counted: "area", "tiles", "patches" or "base64" (core/media.py).
    image_tokens: ImageRule = DEFAULT_IMAGE_RULE


DEFAULT_POLICY = Policy()


# Block and Measurement are made on every MCP message: plain slotted dataclasses (read-only by
# convention) build several times faster than frozen ones.
@dataclass(slots=True)
class Block:
    """One part of a message: its type, total tokens (data + overhead), UTF-8 bytes and overhead share."""

    type: str
    tokens: int
    bytes: int
    overhead_tokens: int = 0

    @property
    def data_tokens(self) -> int:
        return self.tokens - self.overhead_tokens


@dataclass(slots=True)
class Measurement:
    """Token economics of one message."""

    direction: Direction
    method: str
    tool_name: str | None
    blocks: tuple[Block, ...]
    total_tokens: int
    data_tokens: int
    overhead_tokens: int
    overhead_ratio: float
    risk_tier: RiskTier
    error_type: str | None = None
    reason: str | None = None
    bytes: int = field(default=0)
    #: The overhead limit the advisories are judged against (risk.max_overhead_ratio).
    max_overhead_ratio: float = DEFAULT_MAX_OVERHEAD_RATIO

    @property
    def advisories(self) -> tuple[str, ...]:
        """What a user should do about this response; formatted only when read (most never are)."""
        if self.direction != "output":
            return ()
        ratio_over = self.overhead_ratio > self.max_overhead_ratio
        if self.risk_tier not in BREACH_TIERS and not ratio_over:
            return ()
        subject = f"Tool '{self.tool_name}'" if self.tool_name else f"'{self.method}'"
        advice = (
            risk_advisory(self.risk_tier, self.total_tokens, subject),
            overhead_advisory(self.overhead_tokens, self.overhead_ratio, self.max_overhead_ratio),
        )
        return tuple(a for a in advice if a)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        del out["max_overhead_ratio"]
        out["blocks"] = [{**asdict(b), "data_tokens": b.data_tokens} for b in self.blocks]
        out["advisories"] = list(self.advisories)
        return out


class Builder:
    """Accumulates blocks and the reasons for partial answers."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.blocks: list[Block] = []
        self.reasons: list[str] = []
        self.total = self.overhead = self.bytes = 0
        self.pending: list[Any] = []  # bulk sizing to run once the measured items are in

    def run_pending(self) -> None:
        while self.pending:
            self.pending.pop()()

    def text(self, text: Any) -> Size:
        return size_text(text, self.policy.estimator) if isinstance(text, str) else self.value(text)

    def value(self, value: Any) -> Size:
        if value is None:
            return ZERO
        size = size_value(value, self.policy.estimator)
        if size.reason:
            self.reasons.append(size.reason)
        return size

    def add(self, type_: str, data: Size = ZERO, overhead: Size = ZERO) -> None:
        tokens, size = data.tokens + overhead.tokens, data.bytes + overhead.bytes
        self.blocks.append(Block(type_, tokens, size, overhead.tokens))
        self.total += tokens
        self.overhead += overhead.tokens
        self.bytes += size

    def add_counts(self, type_: str, tokens: int, size: int, overhead_tokens: int) -> None:
        """:meth:`add` from the block's totals (the fast paths: no Size made to be summed)."""
        self.blocks.append(Block(type_, tokens, size, overhead_tokens))
        self.total += tokens
        self.overhead += overhead_tokens
        self.bytes += size

    def split(self, type_: str, obj: Mapping[str, Any], data_keys: tuple[str, ...]) -> None:
        """Add ``obj`` as one block whose ``data_keys`` are data and every other field overhead."""
        if len(data_keys) == 1:
            data = self.text(obj.get(data_keys[0]))
        else:
            data = self.value({k: obj[k] for k in data_keys if k in obj})
        rest = {k: v for k, v in obj.items() if k not in data_keys}
        self.add(type_, data, self.value(rest) if rest else ZERO)

    def finish(
        self,
        direction: Direction,
        method: str,
        tool_name: str | None,
        error_type: str | None = None,
    ) -> Measurement:
        total, overhead = self.total, self.overhead
        ratio = overhead / total if total else 0.0
        return Measurement(
            direction,
            method,
            tool_name,
            tuple(self.blocks),
            total,
            total - overhead,
            overhead,
            ratio,
            tier_of(total, self.policy.thresholds),
            error_type,
            "; ".join(dict.fromkeys(self.reasons)) if self.reasons else None,
            self.bytes,
            self.policy.max_overhead_ratio,
        )


def as_mapping(value: Any) -> Mapping[str, Any] | None:
    if type(value) is dict:  # the wire form: an exact-type check is ten times cheaper than the ABC's
        return value
    if isinstance(value, (dict, Mapping)):
        return value
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            dumped = dump(mode="json", by_alias=True, exclude_none=True)
        except Exception:
            return None
        return dumped if isinstance(dumped, (dict, Mapping)) else None
    return None

