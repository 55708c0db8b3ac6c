"""Observed profiles: what a server's tools really returned, from the output-token histograms, beside what their
schemas promise. Pure: samples come in as (name, labels, value) rows from /metrics or a Prometheus query.

Quantiles are interpolated within the catalog's buckets the way Prometheus's ``histogram_quantile`` does them
(linearly; the first bucket starts at 0; a rank in the ``+Inf`` bucket gives the highest finite bound). A
histogram keeps no maximum: ``max`` is an upper bound, the least of the highest non-empty bucket's bound and
the sum minus the smallest values the other observations can have; exact when one call was observed (its sum).
A quantile never exceeds that maximum.

The effective tier of a tool is the worse of its static tier and the tier of its observed p95; for a tool whose
schema declares no bound (unbounded or unknown), observed over at least ``ENOUGH_CALLS`` calls, it is the tier of
its observed p95: the schema says nothing about its size, and that many calls do.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .client_limits import ClientLimitWarning
from .contract import LockError, ServerProfile
from .lock_diff import Difference
from .profiles import Advice, StaticProfile, advice_priority, rank_advice
from .risk import RISK_TIERS, RiskThresholds, RiskTier, tier_of

#: The per-message token histogram (catalog family ``mcp_token_message_tokens``) and the series it is read for.
FAMILY = "mcp_token_message_tokens"
METHOD = "tools/call"
DIRECTION = "output"
#: Result sizes past which a widely used client (Claude Code) warns, and past which it cuts the result by
#: default (its MAX_MCP_OUTPUT_TOKENS).
RESULT_LIMITS: tuple[int, int] = (10_000, 25_000)
#: When several sides measured a tool (a client and its server in one process), the side that saw the most calls
#: is read; on a tie, the first in this order.
SIDE_ORDER: tuple[str, ...] = ("server", "proxy", "client")
#: Calls after which a tool's observed p95 rates it when its schema declares no bound.
ENOUGH_CALLS = 20


@dataclass(frozen=True, slots=True)
class Histogram:
    """One tool's output tokens: cumulative bucket counts by upper bound (``inf`` last), count and sum."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    sum: float


@dataclass(frozen=True, slots=True)
class Observed:
    calls: int
    p50: int
    p95: int
    max: int
    max_exact: bool
    mean: int
    risk: RiskTier

    def to_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "p50": self.p50, "p95": self.p95, "max": self.max,
                "max_exact": self.max_exact, "mean": self.mean, "risk": self.risk}


@dataclass(frozen=True, slots=True)
class ToolView:
    """A tool as listed (``static``) and as observed (``observed``); either may be missing, not both."""

    name: str
    static: StaticProfile | None
    observed: Observed | None

    @property
    def effective_risk(self) -> RiskTier:
        s, o = self.static, self.observed
        if s is not None and o is not None and s.bounded is not True and o.calls >= ENOUGH_CALLS:
            return o.risk  # no declared bound to hold it to: what enough calls returned rates it
        tiers = [t.risk for t in (s, o) if t is not None]
        return max(tiers, key=RISK_TIERS.index)

    @property
    def bounded_but_large(self) -> bool:
        """Declared bounded, observed past the declared worst case or in a worse tier."""
        s, o = self.static, self.observed
        if s is None or o is None or s.bounded is not True:
            return False
        return (s.max_tokens is not None and o.p95 > s.max_tokens) or RISK_TIERS.index(o.risk) > RISK_TIERS.index(
            s.risk)


# --------------------------------------------------------------------------- histograms


def quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The ``q`` quantile of cumulative ``(upper bound, count)`` buckets, as ``histogram_quantile`` computes it;
    None for an empty histogram."""
    ordered = sorted(buckets)
    if not ordered or not math.isinf(ordered[-1][0]) or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower, below = 0.0, 0.0
    for index, (upper, cumulative) in enumerate(ordered):
        if cumulative >= rank:
            if math.isinf(upper):
                return ordered[index - 1][0] if index > 0 else None
            inside = cumulative - below
            return upper if inside <= 0 else lower + (upper - lower) * (rank - below) / inside
        lower, below = upper, max(below, cumulative)
    return None


def _per_bucket(h: Histogram) -> list[tuple[float, float, float]]:
    """(observations, lower bound, upper bound) of each bucket; the first starts at 0 (tokens are never negative)."""
    ordered = sorted(h.buckets)
    out, lower, below = [], 0.0, 0.0
    for upper, cumulative in ordered:
        out.append((max(cumulative - below, 0.0), lower, upper))
        lower, below = upper, max(below, cumulative)
    return out


def _bound_sum(per: Sequence[tuple[float, float, float]], k: float, *, upper: bool) -> float:
    """The sum of the lower bounds of the ``k`` smallest observations, or of the upper bounds of the ``k``
    largest (``upper``)."""
    total, left = 0.0, k
    for n, low, up in reversed(per) if upper else per:
        take = min(n, left)
        if take > 0:
            total += take * (up if upper else low)
            left -= take
    return total


def order_bounds(h: Histogram, j: int) -> tuple[float, float]:
    """Bounds of the ``j``-th smallest of ``h``'s whole-number observations that its sum allows: the n-j+1 from
    it up are at least it and the others above their buckets' lower bounds; the j up to it at most it and the
    others below their upper bounds."""
    per, n = _per_bucket(h), h.count
    high = (h.sum - _bound_sum(per, j - 1, upper=False)) / (n - j + 1)
    low = (h.sum - _bound_sum(per, n - j, upper=True)) / j
    return (low if math.isfinite(low) else 0.0), high


def _whole(h: Histogram) -> bool:
    return h.count >= 1 and all(float(n).is_integer() for n, _, _ in _per_bucket(h)) and float(h.count).is_integer()


def max_bound(h: Histogram) -> tuple[float, bool]:
    """An upper bound of the largest observation, and whether it is exact (the sum allows one value only)."""
    per = _per_bucket(h)
    top = max((i for i, (n, _, _) in enumerate(per) if n > 0), default=None)
    if top is None:
        return 0.0, False
    # Every other observation is above its bucket's lower bound, so the largest is at most the sum minus those.
    others = _bound_sum(per, h.count, upper=False) - per[top][1]
    bound = max(min(per[top][2], h.sum - others), per[top][1])
    if not _whole(h):
        return bound, False
    low, high = order_bounds(h, round(h.count))
    return min(bound, high), high - low < 0.5


def _estimate(q: float, h: Histogram, top: float) -> float | None:
    """The interpolated quantile, kept within the order bounds when the counts are whole (from /metrics)."""
    value = quantile(q, h.buckets)
    if value is None:
        return None
    if _whole(h):
        low, high = order_bounds(h, max(1, math.ceil(q * h.count - 1e-9)))
        value = min(max(value, low), high)
    return min(value, top)


def observe(h: Histogram, thresholds: RiskThresholds) -> Observed | None:
    """Calls, p50, p95, max and the tier of the p95 of one histogram; None when it holds no call."""
    calls = round(h.count)
    top, exact = max_bound(h)
    p50, p95 = _estimate(0.5, h, top), _estimate(0.95, h, top)
    if calls <= 0 or p50 is None or p95 is None:
        return None
    p95_i = math.ceil(p95)
    return Observed(calls=calls, p50=math.ceil(p50), p95=p95_i, max=math.ceil(top), max_exact=exact,
                    mean=round(h.sum / h.count), risk=tier_of(p95_i, thresholds))


def _wanted(labels: Mapping[str, str], server: str) -> bool:
    return (labels.get("server") == server and labels.get("method") == METHOD
            and labels.get("direction", DIRECTION) == DIRECTION)


def histograms(samples: Iterable[tuple[str, Mapping[str, str], float]], server: str) -> dict[str, Histogram]:
    """Per tool, the output-token histogram of ``server``'s tool calls, from ``FAMILY`` samples (``_bucket``,
    ``_count``, ``_sum``); one side per tool (``SIDE_ORDER``)."""
    parts: dict[tuple[str, str], dict[str, Any]] = {}
    for name, labels, value in samples:
        if not name.startswith(FAMILY + "_") or not _wanted(labels, server) or not math.isfinite(value):
            continue
        part = parts.setdefault((labels.get("side", ""), labels.get("tool", "")), {"buckets": {}, "count": 0.0,
                                                                                   "sum": 0.0})
        suffix = name[len(FAMILY) + 1:]
        if suffix == "bucket" and "le" in labels:
            le = float(labels["le"])
            part["buckets"][le] = part["buckets"].get(le, 0.0) + value
        elif suffix in ("count", "sum"):
            part[suffix] += value
    chosen: dict[str, tuple[tuple[float, int], Histogram]] = {}
    for (side, tool), part in parts.items():
        buckets = tuple(sorted(part["buckets"].items()))
        if not buckets or not math.isinf(buckets[-1][0]):
            continue
        count = part["count"] or buckets[-1][1]
        rank = (-count, SIDE_ORDER.index(side) if side in SIDE_ORDER else len(SIDE_ORDER))
        best = chosen.get(tool)
        if best is None or rank < best[0]:
            chosen[tool] = (rank, Histogram(buckets, count, part["sum"]))
    return {tool: h for tool, (_, h) in chosen.items()}


def servers_seen(samples: Iterable[tuple[str, Mapping[str, str], float]]) -> list[str]:
    """The server labels of the tool-call output histograms, for a hint when the chosen one has none."""
    return sorted({labels["server"] for name, labels, _ in samples
                   if name.startswith(FAMILY + "_") and "server" in labels and labels.get("method") == METHOD
                   and labels.get("direction", DIRECTION) == DIRECTION})


def observe_all(found: Mapping[str, Histogram], thresholds: RiskThresholds) -> dict[str, Observed]:
    """The tools with at least one observed call."""
    out = {tool: observe(h, thresholds) for tool, h in found.items()}
    return {tool: o for tool, o in sorted(out.items()) if o is not None}


# --------------------------------------------------------------------------- static and observed together


def merge(profile: ServerProfile, observed: Mapping[str, Observed]) -> list[ToolView]:
    """Every listed tool with its observations (None: never observed), "declared bounded but observed large"
    first, then the others as listed, then the tools observed but not listed."""
    listed = [ToolView(t.tool_name, t, observed.get(t.tool_name)) for t in profile.tools]
    names = {t.tool_name for t in profile.tools}
    unlisted = [ToolView(name, None, o) for name, o in observed.items() if name not in names]
    return [v for v in listed if v.bounded_but_large] + [v for v in listed if not v.bounded_but_large] + unlisted


def view_advice(views: Sequence[ToolView]) -> tuple[Advice, ...]:
    """The listed tools' recommendations ranked by impact with observations: priority from the effective tier
    (an action's report from its observed tier), then the larger observed p95 first."""
    entries = []
    for v in views:
        if v.static is not None:
            seen = v.observed.risk if v.observed else None
            entries.append((v.static, advice_priority(v.static, v.effective_risk, seen),
                            v.observed.p95 if v.observed else -1))
    return rank_advice(entries)


def overall_effective_risk(views: Sequence[ToolView]) -> RiskTier:
    return max((v.effective_risk for v in views), key=RISK_TIERS.index, default="low")


def result_size_warnings(views: Sequence[ToolView]) -> list[ClientLimitWarning]:
    """A warning per tool whose observed p95 is past what a widely used client warns about or cuts."""
    warn, cut = RESULT_LIMITS
    out: list[ClientLimitWarning] = []
    for v in views:
        o = v.observed
        if o is None or o.p95 <= warn:
            continue
        limit, what = (cut, "cuts results this large by default") if o.p95 > cut else (warn, "warns about results "
                                                                                         "this large")
        out.append(ClientLimitWarning(v.name, "observed result size", limit, o.p95,
                                      f"observed p95 result is {o.p95:,} tokens, over {limit:,}: a widely used "
                                      f"client {what}"))
    return out


# --------------------------------------------------------------------------- lock and check


def with_effective(lock: dict[str, Any], views: Sequence[ToolView]) -> dict[str, Any]:
    """``lock`` with each listed tool's ``effective_risk`` (written only when observations were given)."""
    by_name = {v.name: v for v in views if v.static is not None}
    for name, entry in lock["tools"].items():
        entry["effective_risk"] = by_name[name].effective_risk if name in by_name else entry["risk"]
    return lock


def validate_effective(lock: Mapping[str, Any]) -> None:
    """LockError for an ``effective_risk`` that is not a tier (a lock without any is fine)."""
    for name, entry in lock.get("tools", {}).items():
        value = entry.get("effective_risk", entry.get("risk"))
        if value not in RISK_TIERS:
            raise LockError(f"tools.{name}.effective_risk: expected one of {', '.join(RISK_TIERS)}, got {value!r}")


def effective_differences(lock: Mapping[str, Any], views: Sequence[ToolView]) -> list[Difference]:
    """RISKY when observations put a locked tool in a worse tier than the lock's effective (else static) tier;
    SAFE when a lock's effective tier went down."""
    out: list[Difference] = []
    for v in views:
        entry = lock.get("tools", {}).get(v.name)
        if entry is None or v.static is None:
            continue
        before, after = entry.get("effective_risk", entry["risk"]), v.effective_risk
        o = v.observed
        if o is not None and RISK_TIERS.index(o.risk) > RISK_TIERS.index(before):
            out.append(Difference("RISKY", "tool", v.name, "effective risk tier up",
                                  f"{before} -> {after} (observed p95 {o.p95:,} tokens over {o.calls:,} calls)"))
        elif "effective_risk" in entry and RISK_TIERS.index(after) < RISK_TIERS.index(before):
            out.append(Difference("SAFE", "tool", v.name, "effective risk tier down", f"{before} -> {after}"))
    return out
