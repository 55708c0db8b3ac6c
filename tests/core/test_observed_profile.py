"""The pure parts of observed profiles, on fixed inputs: quantiles from buckets (histogram_quantile's way), the
bounds the sum allows, reading /metrics samples, the merge with a static profile, the client-limit warnings and
check's effective-tier rule."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mcp_token_otel.core.contract import LockError, build_lock, profile_server
from mcp_token_otel.core.observed import (
    Histogram,
    Observed,
    effective_differences,
    histograms,
    max_bound,
    merge,
    observe,
    quantile,
    result_size_warnings,
    validate_effective,
    with_effective,
)
from mcp_token_otel.core.risk import DEFAULT_THRESHOLDS

INF = math.inf
LES = (64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, INF)


def hist(per_bucket: dict[float, int], total: float) -> Histogram:
    """A histogram from counts per bucket (by upper bound) and the sum."""
    running, buckets = 0.0, []
    for le in LES:
        running += per_bucket.get(le, 0)
        buckets.append((le, running))
    return Histogram(tuple(buckets), running, total)


def test_quantile_interpolates_as_histogram_quantile() -> None:
    h = hist({256.0: 10, 1024.0: 10}, 0)
    assert quantile(0.5, h.buckets) == 256.0  # rank 10 closes the first non-empty bucket
    assert quantile(0.75, h.buckets) == 256.0 + 768.0 * 0.5
    assert quantile(0.95, h.buckets) == pytest.approx(256.0 + 768.0 * 0.9)
    assert quantile(0.5, hist({64.0: 1}, 0).buckets) == 32.0  # the first bucket starts at 0
    assert quantile(0.95, hist({INF: 2}, 0).buckets) == 1048576.0  # +Inf: the highest finite bound
    assert quantile(0.5, hist({}, 0).buckets) is None


def test_the_sum_bounds_the_maximum_and_the_quantiles() -> None:
    one = observe(hist({65536.0: 1}, 22_142), DEFAULT_THRESHOLDS)
    assert one == Observed(calls=1, p50=22_142, p95=22_142, max=22_142, max_exact=True, mean=22_142, risk="critical")
    # Three calls of about 22,000 tokens: the interpolation alone says 40,960 and 63,078.
    three = observe(hist({65536.0: 3}, 66_426), DEFAULT_THRESHOLDS)
    assert three is not None
    assert (three.p50, three.p95, three.max, three.max_exact) == (25_021, 33_658, 33_658, False)
    assert max_bound(hist({1024.0: 2, 4096.0: 1}, 3_000)) == (2_488.0, False)  # 3,000 minus two values above 256
    assert max_bound(hist({INF: 2}, 3_000_000)) == (3_000_000 - 1048576.0, False)  # +Inf: the sum bounds it
    small = observe(hist({64.0: 1, 256.0: 1}, 150), DEFAULT_THRESHOLDS)
    assert small is not None and small.p95 <= small.max <= 150 and small.risk == "low"


def test_fractional_counts_are_bounded_by_the_maximum_only() -> None:
    """Prometheus's increase() extrapolates: counts are not whole, so the quantiles are histogram_quantile's (40,960
    and 63,078 here) under the maximum's bound: 3.2 x 22,142 minus 2.2 x 16,384."""
    h = Histogram(((16384.0, 0.0), (65536.0, 3.2), (INF, 3.2)), 3.2, 3.2 * 22_142)
    o = observe(h, DEFAULT_THRESHOLDS)
    assert o is not None and (o.calls, o.p50, o.p95, o.max, o.max_exact) == (3, 34_810, 34_810, 34_810, False)
    wide = Histogram(((1024.0, 0.0), (4096.0, 10.5), (INF, 10.5)), 10.5, 10.5 * 3_000)
    o = observe(wide, DEFAULT_THRESHOLDS)
    assert o is not None and o.p50 == 2_560 and o.risk == "medium"  # 1,024 + 3,072 x 0.5; max 31,500 - 9.5 x 1,024


METRICS = """\
# TYPE mcp_token_message_tokens histogram
mcp_token_message_tokens_bucket{side="server",server="fs",tool="rd",method="tools/call",direction="output",le="64"} 0
mcp_token_message_tokens_bucket{side="server",server="fs",tool="rd",method="tools/call",direction="output",le="+Inf"} 2
mcp_token_message_tokens_count{side="server",server="fs",tool="rd",method="tools/call",direction="output"} 2
mcp_token_message_tokens_sum{side="server",server="fs",tool="rd",method="tools/call",direction="output"} 5e6
mcp_token_message_tokens_bucket{side="client",server="fs",tool="rd",method="tools/call",direction="output",le="64"} 1
mcp_token_message_tokens_bucket{side="client",server="fs",tool="rd",method="tools/call",direction="output",le="+Inf"} 1
mcp_token_message_tokens_count{side="client",server="fs",tool="rd",method="tools/call",direction="output"} 1
mcp_token_message_tokens_sum{side="client",server="fs",tool="rd",method="tools/call",direction="output"} 10
mcp_token_message_tokens_bucket{side="server",server="fs",method="tools/call",tool="rd",direction="input",le="+Inf"} 9
mcp_token_message_tokens_bucket{side="server",server="fs",method="tools/list",tool="",direction="output",le="+Inf"} 9
mcp_token_message_tokens_bucket{side="server",server="g",method="tools/call",tool="log",direction="output",le="+Inf"} 9
"""


def test_samples_of_one_server_one_side_per_tool() -> None:
    samples = [(s.name, s.labels, s.value) for f in text_string_to_metric_families(METRICS) for s in f.samples]
    found = histograms(samples, "fs")
    assert list(found) == ["rd"]  # inputs, tools/list and the other server are not results of fs's tools
    assert found["rd"].count == 2 and found["rd"].sum == 5e6  # the side that saw more calls
    assert histograms(samples, "nobody") == {}


TOOLS = [
    {"name": "read", "inputSchema": {"type": "object"},
     "outputSchema": {"type": "object", "properties": {"content": {"type": "string", "maxLength": 2000}}}},
    {"name": "list", "inputSchema": {"type": "object"}},
    {"name": "idle", "inputSchema": {"type": "object"}},
]


def observed(p95: int, risk: str, calls: int = 3) -> Observed:
    return Observed(calls=calls, p50=p95, p95=p95, max=p95, max_exact=False, mean=p95, risk=risk)  # type: ignore[arg-type]


def test_merge_orders_bounded_but_large_first_then_listed_then_unlisted() -> None:
    profile = profile_server(TOOLS, server_name="fs")
    views = merge(profile, {"list": observed(40, "low"), "read": observed(30_000, "critical"),
                            "ghost": observed(12_000, "critical")})
    assert [v.name for v in views] == ["read", "list", "idle", "ghost"]
    read, listing, idle, ghost = views
    assert read.bounded_but_large and read.static is not None and read.static.risk == "low"
    assert read.effective_risk == "critical"
    assert listing.effective_risk == "high" and not listing.bounded_but_large  # unknown statically: high stays
    assert idle.observed is None and idle.effective_risk == "high"
    assert ghost.static is None and ghost.effective_risk == "critical"
    warnings = result_size_warnings(views)
    assert [(w.subject, w.limit, w.value) for w in warnings] == [("read", 25_000, 30_000), ("ghost", 10_000, 12_000)]
    assert "cuts results this large" in warnings[0].message and "warns" in warnings[1].message


def test_check_flags_an_effective_tier_made_worse_by_observations() -> None:
    profile = profile_server(TOOLS, server_name="fs")
    lock = build_lock(profile)
    views = merge(profile, {"read": observed(30_000, "critical"), "list": observed(40, "low")})
    found = effective_differences(lock, views)
    assert [(d.cls, d.subject, d.change, d.detail) for d in found] == [
        ("RISKY", "read", "effective risk tier up", "low -> critical (observed p95 30,000 tokens over 3 calls)")]
    locked = with_effective(build_lock(profile), views)
    assert locked["tools"]["read"]["effective_risk"] == "critical"
    assert locked["tools"]["idle"]["effective_risk"] == "high"
    assert effective_differences(locked, views) == []
    calmer = merge(profile, {"read": observed(300, "low")})
    assert [(d.cls, d.change, d.detail) for d in effective_differences(locked, calmer)] == [
        ("SAFE", "effective risk tier down", "critical -> low")]
    locked["tools"]["read"]["effective_risk"] = "huge"
    with pytest.raises(LockError, match=r"tools\.read\.effective_risk"):
        validate_effective(locked)
