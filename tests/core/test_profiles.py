from __future__ import annotations

import math

import pytest

from mcp_token_otel import aggregate_profiles, compute_static_profile, estimate_tokens, profile_tool_definition
from mcp_token_otel.core.bounds import VALUE_TOKENS
from mcp_token_otel.core.profiles import (
    ENVELOPE_TOKENS,
    UNKNOWN_ITEM_TOKENS,
    base_tokens_of,
    tool_definition_tokens,
)


def base_of(fields: list[str]) -> int:
    return 2 + sum(estimate_tokens(f'"{f}":') + VALUE_TOKENS for f in fields)


def test_bounds_in_priority_order() -> None:
    fields = ["path", "size", "mtime"]
    base = base_of(fields)
    egress = compute_static_profile("ls", fields, agent_limit=10, egress_max_bytes=7001)
    assert egress.max_tokens == math.ceil(7001 / 3.5) and egress.bounded
    limited = compute_static_profile("ls", fields, agent_limit=10)
    assert limited.max_tokens == base * 10 + ENVELOPE_TOKENS and limited.bounded
    unbounded = compute_static_profile("ls", fields)
    # No item limit and no egress cap: unbounded, no maximum (never a stand-in figure), critical.
    assert unbounded.max_tokens is None and unbounded.bounded is False and unbounded.risk == "critical"
    assert unbounded.reason == "unbounded: no item limit and no egress cap"
    assert unbounded.min_tokens == base


def test_recommendation_rules() -> None:
    p = compute_static_profile("search", ["results", "total"])
    text = " ".join(p.recommendations)
    assert "no result limit" in text and "collection fields without a limit (results)" in text
    wide = compute_static_profile("dump", [f"field{i}" for i in range(16)], agent_limit=1000)
    assert wide.risk == "critical"
    assert any("up to" in r and "(critical)" in r for r in wide.recommendations)
    assert any("16 fields per item" in r for r in wide.recommendations)
    calm = compute_static_profile("get", ["id", "name"], agent_limit=1)
    assert calm.risk == "low" and calm.recommendations == ()


def test_aggregate_orders_critical_first() -> None:
    low = compute_static_profile("get", ["id"], agent_limit=1)
    high = compute_static_profile("page", ["title", "body"], egress_max_bytes=20_000)
    crit = compute_static_profile("dump", ["a"], egress_max_bytes=100_000)
    unb = compute_static_profile("walk", ["path"])
    agg = aggregate_profiles([low, high, unb, crit])
    assert agg.overall_risk == "critical"
    # An unbounded tool is critical: it comes first with the critical ones, in listing order.
    assert agg.critical_tool_names == ("walk", "dump") and agg.unbounded_tool_names == ("walk",)
    assert agg.recommendations[0].startswith("Tool 'walk'")
    assert agg.recommendations[1].startswith("Tool 'dump'")
    assert agg.recommendations[2].startswith("Tool 'page'")
    assert aggregate_profiles([]).overall_risk == "low"


def test_profile_of_a_real_tool_definition() -> None:
    tool = {
        "name": "list_issues",
        "description": "List issues in a repository.",
        "inputSchema": {"type": "object", "properties": {"repo": {"type": "string"}}},
        "outputSchema": {"type": "object", "properties": {
            "issues": {"type": "array", "maxItems": 30, "items": {"type": "object", "properties": {
                "number": {"type": "integer"}, "title": {"type": "string"}, "labels": {"type": "array"}}}},
            "total": {"type": "integer"}}},
    }
    # Nested 'labels' has no maxItems: unbounded at any depth, and said so.
    p = profile_tool_definition(tool)
    assert p.bounded is False and p.field_count == 3 and p.max_tokens is None and p.risk == "critical"
    assert p.reason == 'unbounded: array "issues[].labels" has no maxItems'
    tool["outputSchema"]["properties"]["issues"]["items"]["properties"]["labels"]["maxItems"] = 5
    p = profile_tool_definition(tool)
    item = base_of(["number", "title"]) + estimate_tokens('"labels":') + 2 + 5 * (VALUE_TOKENS + 1)
    total = estimate_tokens('"total":') + VALUE_TOKENS
    assert p.bounded and p.max_tokens == item * 30 + total + ENVELOPE_TOKENS
    assert p.definition_tokens > 20
    del tool["outputSchema"]["properties"]["issues"]["maxItems"]
    p = profile_tool_definition(tool)
    assert not p.bounded and any('array "issues" has no maxItems' in r for r in p.recommendations)
    bare = profile_tool_definition({"name": "export", "inputSchema": {}})
    # No outputSchema: unknown, no invented figure; rated high.
    assert bare.bounded is None and bare.field_count == 0 and bare.max_tokens is None and bare.risk == "high"
    assert bare.reason == "unknown: no outputSchema"
    assert any("no outputSchema" in r for r in bare.recommendations)
    single = profile_tool_definition({"name": "now", "outputSchema": {"type": "object", "properties": {
        "time": {"type": "string"}}}})
    assert single.bounded and single.max_tokens == base_of(["time"]) + ENVELOPE_TOKENS


def test_uninformative_output_schema_is_not_safer_than_none() -> None:
    # Issue 9: {}, {"type": "object"} and a non-object say nothing about the result: same as no schema.
    none = profile_tool_definition({"name": "t", "inputSchema": {}})
    for schema in ({}, {"type": "object"}, {"type": "object", "properties": {}}, "object", [1], 3, True):
        p = profile_tool_definition({"name": "t", "inputSchema": {}, "outputSchema": schema})
        assert (p.risk, p.bounded, p.max_tokens, p.limit_source) == (none.risk, none.bounded, none.max_tokens, "none")
        assert (p.risk, p.bounded) == ("high", None), schema  # unknown, rated high
        assert any("no result fields declared" in r for r in p.recommendations)
    assert any("not an object (str)" in r for r in profile_tool_definition(
        {"name": "t", "outputSchema": "object"}).recommendations)
    assert any("declares no properties" in r for r in profile_tool_definition(
        {"name": "t", "outputSchema": {"type": "object"}}).recommendations)


def test_users_example_under_both_base_token_rules() -> None:
    fields = ["id", "name", "email", "address"]
    seed = compute_static_profile("users", fields, agent_limit=50, rule="compact")
    assert (seed.max_tokens, seed.risk, seed.base_tokens, seed.bounded) == (1450, "medium", 28, True)
    default = compute_static_profile("users", fields, agent_limit=50)
    assert (default.max_tokens, default.risk, default.base_tokens) == (2200, "medium", 43)
    assert default.rule == "default" and seed.rule == "compact" and seed.limit == 50
    # "seed" is the compact rule's older name, still accepted.
    assert compute_static_profile("users", fields, agent_limit=50, rule="seed") == seed
    assert base_tokens_of([], "compact") == base_tokens_of([], "default") == UNKNOWN_ITEM_TOKENS
    with pytest.raises(ValueError, match="unknown base-token rule 'x'"):
        base_tokens_of(fields, "x")


def test_definition_tokens_count_what_enters_the_context() -> None:
    tool = {"name": "get", "description": "Get one.", "inputSchema": {"type": "object"},
            "annotations": {"readOnlyHint": True}, "_meta": {"x": "y" * 400}, "title": "Get"}
    counted = tool_definition_tokens(tool)
    assert counted == estimate_tokens('{"name":"get","description":"Get one.","inputSchema":{"type":"object"}}')
    assert profile_tool_definition(tool).definition_tokens == counted
    assert tool_definition_tokens(tool, lambda text: len(text)) == len(
        '{"name":"get","description":"Get one.","inputSchema":{"type":"object"}}')


def test_limit_sources() -> None:
    def out(schema: dict[str, object]) -> str:
        return profile_tool_definition({"name": "t", "outputSchema": schema}).limit_source

    # A lone free string is the result's content (unbounded); beside another field it is a short value.
    assert out({"type": "object", "properties": {"a": {"type": "string"}}}) == "none"
    assert out({"type": "object", "properties": {"a": {"type": "string"}, "n": {"type": "integer"}}}) == "single object"
    assert out({"type": "object", "properties": {"a": {"type": "array", "maxItems": 5}}}) == "maxItems"
    assert out({"type": "object", "properties": {"a": {"type": "array"}}}) == "none"
    capped = profile_tool_definition({"name": "t"}, egress_max_bytes=7000)
    assert capped.limit_source == "egress" and capped.bounded and capped.limit is None
