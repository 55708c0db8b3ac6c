from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_token_otel import RISK_TIERS, RiskThresholds, classify_risk
from mcp_token_otel.core.risk import overhead_advisory, risk_advisory


@pytest.mark.parametrize(
    ("tokens", "tier"),
    [(0, "low"), (1000, "low"), (1001, "medium"), (4000, "medium"), (4001, "high"), (8000, "high"),
     (8001, "critical"), (10**9, "critical")],
)
def test_default_tier_boundaries(tokens: int, tier: str) -> None:
    assert classify_risk(tokens) == tier


def test_custom_thresholds_in_every_form() -> None:
    for form in (RiskThresholds(10, 20, 30), {"low": 10, "medium": 20, "high": 30}, (10, 20, 30)):
        assert [classify_risk(t, form) for t in (10, 11, 20, 21, 30, 31)] == [
            "low", "medium", "medium", "high", "high", "critical"]


@pytest.mark.parametrize(
    ("bad", "message"),
    [((0, 20, 30), "risk.thresholds.low: expected a positive integer"),
     ((10, -1, 30), "risk.thresholds.medium: expected a positive integer"),
     ((10, 10, 30), "strictly increasing"),
     ((30, 20, 10), "strictly increasing"),
     ((10, 20), "expected 3 values"),
     ({"low": 1, "medium": 2, "hihg": 3}, "unknown keys ['hihg']"),
     ((1.5, 2, 3), "risk.thresholds.low: expected a positive integer")],
)
def test_invalid_thresholds_are_named(bad: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        classify_risk(5, bad)  # type: ignore[arg-type]


@given(st.integers(0, 10**7), st.integers(0, 10**7))
def test_tier_is_monotonic_in_tokens(a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    assert RISK_TIERS.index(classify_risk(lo)) <= RISK_TIERS.index(classify_risk(hi))


@given(st.lists(st.integers(1, 10**6), min_size=3, max_size=3, unique=True), st.integers(0, 2 * 10**6))
def test_tier_boundaries_match_thresholds(bounds: list[int], tokens: int) -> None:
    low, medium, high = sorted(bounds)
    tier = classify_risk(tokens, (low, medium, high))
    expected = ("low" if tokens <= low else "medium" if tokens <= medium
                else "high" if tokens <= high else "critical")
    assert tier == expected


def test_advisories_name_tool_and_count() -> None:
    critical = risk_advisory("critical", 12345, "Tool 'search'")
    assert critical is not None and "Tool 'search'" in critical and "12,345" in critical
    high = risk_advisory("high", 5000, "Tool 'x'")
    assert high is not None and "5,000" in high and "Tool 'x'" in high
    assert risk_advisory("medium", 2000, "Tool 'x'") is None
    assert overhead_advisory(10, 0.3) is None
    warn = overhead_advisory(40, 0.31)
    assert warn is not None and "31%" in warn and "30%" in warn
