from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_token_otel import RiskThresholds, measure_error, measure_message, measure_request, measure_result
from mcp_token_otel.core.estimation import estimate_tokens
from mcp_token_otel.core.measure import Policy, infer_method
from tests.conftest import chars4


def c4(text: str) -> int:
    return math.ceil(len(text) / 4)


def test_tools_call_input_counts_name_and_arguments_not_meta(chars4_policy: Policy) -> None:
    m = measure_request("tools/call", {"name": "search", "arguments": {"q": "cats"},
                                       "_meta": {"progressToken": "x" * 400}}, chars4_policy)
    assert [b.type for b in m.blocks] == ["tool_name", "arguments"]
    assert m.total_tokens == c4("search") + c4('{"q":"cats"}')
    assert m.direction == "input" and m.tool_name == "search" and m.overhead_tokens == 0


def test_other_inputs(chars4_policy: Policy) -> None:
    assert measure_request("resources/read", {"uri": "file:///a/b.txt"}, chars4_policy).total_tokens == c4(
        "file:///a/b.txt")
    m = measure_request("prompts/get", {"name": "p", "arguments": {"a": "b"}}, chars4_policy)
    assert m.total_tokens == c4("p") + c4('{"a":"b"}')
    m = measure_request("completion/complete", {"ref": {"type": "x"}, "_meta": {"k": "v" * 99}}, chars4_policy)
    assert m.total_tokens == c4('{"ref":{"type":"x"}}')
    assert measure_request("tools/list", None, chars4_policy).total_tokens == 0


def test_text_block_data_and_framing(chars4_policy: Policy) -> None:
    text = "y" * 4000
    m = measure_result("tools/call", {"content": [{"type": "text", "text": text,
                                                   "annotations": {"audience": ["user"]}}]},
                       tool_name="t", policy=chars4_policy)
    (block,) = m.blocks
    assert block.data_tokens == 1000
    assert block.overhead_tokens == c4('{"type":"text","annotations":{"audience":["user"]}}')
    assert m.total_tokens == m.data_tokens + m.overhead_tokens
    assert m.risk_tier == "medium"  # 1000 data tokens plus framing is above the low tier


def test_duplicated_structured_content_is_overhead(chars4_policy: Policy) -> None:
    payload = {"rows": list(range(200))}
    result = {"content": [{"type": "text", "text": json.dumps(payload, indent=2)}],
              "structuredContent": payload}
    m = measure_result("tools/call", result, policy=chars4_policy)
    sc = next(b for b in m.blocks if b.type == "structuredContent")
    assert sc.overhead_tokens == sc.tokens > 0
    # MCPServer wraps plain text as {"result": text}: also a duplicate
    m = measure_result("tools/call", {"content": [{"type": "text", "text": "abc" * 100}],
                                      "structuredContent": {"result": "abc" * 100}}, policy=chars4_policy)
    assert m.overhead_ratio > 0.45
    # a structuredContent with different data is data
    m = measure_result("tools/call", {"content": [{"type": "text", "text": "summary"}],
                                      "structuredContent": payload}, policy=chars4_policy)
    sc = next(b for b in m.blocks if b.type == "structuredContent")
    assert sc.overhead_tokens == 0


def test_meta_and_other_result_fields_are_overhead(chars4_policy: Policy) -> None:
    m = measure_result("tools/call", {"content": [], "_meta": {"trace": "z" * 396}, "isError": False},
                       policy=chars4_policy)
    assert m.data_tokens == 0 and m.overhead_ratio == 1.0
    assert {b.type for b in m.blocks} == {"_meta", "framing"}


def test_binary_resource_and_link_blocks(chars4_policy: Policy) -> None:
    b64 = "QUJD" * 250
    result = {"content": [
        {"type": "image", "data": b64, "mimeType": "image/png"},
        {"type": "audio", "data": b64, "mimeType": "audio/wav"},
        {"type": "resource_link", "uri": "file:///x", "name": "x", "mimeType": "text/plain"},
        {"type": "resource", "resource": {"uri": "file:///y", "text": "t" * 400, "mimeType": "text/plain"}},
        {"type": "resource", "resource": {"uri": "file:///z", "blob": b64}},
        {"type": "mystery", "foo": "bar"},
    ]}
    m = measure_result("tools/call", result, policy=chars4_policy)
    by_type = [(b.type, b.data_tokens) for b in m.blocks]
    assert by_type[0] == ("image", 250) and by_type[1] == ("audio", 250)
    assert by_type[2] == ("resource_link", c4('{"uri":"file:///x","name":"x"}'))
    assert by_type[3] == ("resource", 100) and by_type[4] == ("resource", 250)
    assert by_type[5][0] == "mystery" and by_type[5][1] > 0
    assert all(b.overhead_tokens > 0 for b in m.blocks[:5])


def test_is_error_result_and_jsonrpc_error(chars4_policy: Policy) -> None:
    m = measure_result("tools/call", {"content": [{"type": "text", "text": "boom"}], "isError": True},
                       policy=chars4_policy)
    assert m.error_type == "tool_error" and m.data_tokens == 1
    m = measure_error("tools/call", {"code": -32602, "message": "Invalid params", "data": {"field": "q"}},
                      policy=chars4_policy)
    assert m.error_type == "-32602"
    assert m.total_tokens == c4('{"code":-32602,"message":"Invalid params","data":{"field":"q"}}')

    class FakeMcpError(Exception):
        code = -32601
        message = "Method not found"
        data = None

    assert measure_error("x", FakeMcpError(), policy=chars4_policy).error_type == "-32601"


def test_tools_list_counts_definitions_and_schemas(chars4_policy: Policy) -> None:
    tool = {"name": "search", "description": "Find", "inputSchema": {"type": "object"},
            "outputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}, "_meta": {"a": 1}}
    m = measure_result("tools/list", {"tools": [tool, tool], "nextCursor": "c"}, policy=chars4_policy)
    tools = [b for b in m.blocks if b.type == "tool"]
    assert len(tools) == 2
    assert tools[0].data_tokens == c4(
        '{"name":"search","description":"Find","inputSchema":{"type":"object"},"outputSchema":{"type":"object"}}')
    assert tools[0].overhead_tokens == c4('{"annotations":{"readOnlyHint":true},"_meta":{"a":1}}')
    assert m.blocks[-1].type == "framing"


def test_other_shapes(chars4_policy: Policy) -> None:
    m = measure_result("resources/read", {"contents": [{"uri": "u", "text": "a" * 40}]}, policy=chars4_policy)
    assert m.data_tokens == 10
    m = measure_result("prompts/get", {"description": "d", "messages": [
        {"role": "user", "content": {"type": "text", "text": "b" * 80}}]}, policy=chars4_policy)
    assert any(b.type == "message:text" and b.data_tokens == 20 for b in m.blocks)
    m = measure_result("completion/complete", {"completion": {"values": ["a"]}}, policy=chars4_policy)
    assert m.overhead_tokens == 0 and m.total_tokens > 0
    m = measure_result("x", "just a string" * 10, policy=chars4_policy)
    assert m.total_tokens > 0
    assert measure_result("ping", {}, policy=chars4_policy).total_tokens == 0


def test_measure_message_dispatch(chars4_policy: Policy) -> None:
    req = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t", "arguments": {}}}
    assert measure_message(req, policy=chars4_policy).direction == "input"
    resp = {"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": "hi"}]}}
    m = measure_message(resp, policy=chars4_policy)
    assert (m.direction, m.method) == ("output", "tools/call")
    err = {"jsonrpc": "2.0", "id": 1, "error": {"code": -32000, "message": "x"}}
    assert measure_message(err, request_method="tools/call", policy=chars4_policy).error_type == "-32000"
    assert infer_method({"tools": []}) == "tools/list" and infer_method(42) == "unknown"
    for junk in (None, 42, [1, 2], "text", {"jsonrpc": "2.0"}, {"method": 5}):
        assert measure_message(junk, policy=chars4_policy).total_tokens >= 0


def test_advisories_on_critical_and_overhead(chars4_policy: Policy) -> None:
    m = measure_result("tools/call", {"content": [{"type": "text", "text": "w" * 40_000}]},
                       tool_name="dump", policy=chars4_policy)
    assert m.risk_tier == "critical" and "Tool 'dump'" in m.advisories[0] and "10,00" in m.advisories[0]
    custom = Policy(estimator=chars4, thresholds=RiskThresholds(100_000, 200_000, 300_000),
                    max_overhead_ratio=0.9)
    assert measure_result("tools/call", {"content": [{"type": "text", "text": "w" * 40_000}]},
                          policy=custom).advisories == ()


def test_to_dict_is_json_serialisable(chars4_policy: Policy) -> None:
    m = measure_result("tools/call", {"content": [{"type": "text", "text": "hi"}], "_meta": {}},
                       policy=chars4_policy)
    out = json.loads(json.dumps(m.to_dict()))
    assert out["blocks"][0]["data_tokens"] == 1 and out["risk_tier"] == "low"


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=50))
json_value = st.recursive(json_leaf, lambda c: st.one_of(st.lists(c, max_size=5),
                                                          st.dictionaries(st.text(max_size=10), c, max_size=5)),
                          max_leaves=30)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["content", "structuredContent", "_meta", "isError", "tools", "x"]),
                       json_value, max_size=4))
def test_invariants_hold_on_any_result(result: dict) -> None:
    policy = Policy(estimator=chars4)
    m = measure_result("tools/call", result, policy=policy)
    assert 0.0 <= m.overhead_ratio <= 1.0
    assert m.total_tokens == m.data_tokens + m.overhead_tokens == sum(b.tokens for b in m.blocks)
    assert all(0 <= b.overhead_tokens <= b.tokens for b in m.blocks)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=300), st.text(max_size=300))
def test_more_text_never_means_fewer_tokens(a: str, b: str) -> None:
    def total(text: str) -> int:
        return measure_result("tools/call", {"content": [{"type": "text", "text": text}]}).total_tokens

    assert total(a + b) >= total(a)


def test_many_content_blocks_are_bounded_and_sized_in_bulk_without_undercount() -> None:
    """100k blocks: the first MAX_BLOCKS one by one, the rest in bulk with the same data/overhead split."""
    from mcp_token_otel.core.measure import MAX_BLOCKS

    block = {"type": "text", "text": "row of data number 12345"}
    many = {"content": [dict(block) for _ in range(100_000)]}
    few = {"content": [dict(block) for _ in range(MAX_BLOCKS)]}
    m, f = measure_result("tools/call", many), measure_result("tools/call", few)
    assert len(m.blocks) == MAX_BLOCKS + 1 and m.blocks[-1].type == "content:bulk"
    assert m.reason is not None and "sized in bulk" in m.reason
    per_block = f.total_tokens / MAX_BLOCKS
    assert abs(m.total_tokens - per_block * 100_000) / (per_block * 100_000) < 0.10
    assert abs(m.overhead_ratio - f.overhead_ratio) < 0.05


@pytest.mark.slow
def test_a_million_key_structured_content_and_a_three_million_key_message() -> None:
    structured = {f"key{i}": i for i in range(1_000_000)}
    m = measure_result("tools/call", {"content": [], "structuredContent": structured})
    text = json.dumps(structured, separators=(",", ":"))
    assert m.bytes >= len(text) and m.total_tokens >= estimate_tokens(text) * 0.99
    huge = {f"k{i}": "v" for i in range(3_000_000)}
    whole = measure_message(huge)
    reference = estimate_tokens(json.dumps(huge, separators=(",", ":")))
    assert abs(whole.total_tokens - reference) / reference < 0.05


def test_a_one_member_wrapper_repeating_a_text_block_is_overhead() -> None:
    """The filesystem server's read_text_file and directory_tree answer {"content": <the same text>}: the copy is
    overhead, sized as the text plus its wrapper, so the data is the text once (what a cap's notice counts)."""
    text = "src/\n  main.py\n  util.py\n" * 400
    wrapped = measure_result("tools/call", {"content": [{"type": "text", "text": text}],
                                            "structuredContent": {"content": text}})
    alone = measure_result("tools/call", {"content": [{"type": "text", "text": text}]})
    copy = next(b for b in wrapped.blocks if b.type == "structuredContent")
    assert copy.overhead_tokens == copy.tokens > alone.data_tokens  # all overhead: the text and its wrapper
    assert wrapped.data_tokens == alone.data_tokens
    # A different value under the one key is data, as before.
    other = measure_result("tools/call", {"content": [{"type": "text", "text": text}],
                                          "structuredContent": {"content": "something else"}})
    assert next(b for b in other.blocks if b.type == "structuredContent").overhead_tokens == 0
