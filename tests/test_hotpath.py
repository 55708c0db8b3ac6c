"""The hot path's shortcuts give exactly what the general rules give (measure fast paths, size caches, budgets)."""

from __future__ import annotations

from typing import Any

import pytest

from mcp_token_otel.core import measure as measure_module
from mcp_token_otel.core import payload
from mcp_token_otel.core.budget import SessionBudget
from mcp_token_otel.core.estimation import estimate_tokens
from mcp_token_otel.core.measure import DEFAULT_POLICY, measure_result

TEXT = ("lorem ipsum dolor sit amet, " * 80)[:2048]
META = {"io.modelcontextprotocol/serverInfo": {"name": "bench", "version": ""}}


def _results() -> list[Any]:
    copy = "".join(list(TEXT))  # an equal string that is not the same object, as after serialisation
    return [
        {"content": [{"type": "text", "text": TEXT}], "isError": False, "resultType": "complete",
         "structuredContent": {"result": copy}, "_meta": META},
        {"content": [{"type": "text", "text": TEXT}], "isError": True},
        {"content": [{"type": "text", "text": ""}], "structuredContent": {"result": ""}},
        {"content": [{"type": "text", "text": "héllo ✓ 你好"}], "structuredContent": {"result": "héllo ✓ 你好"}},
        {"content": [{"type": "text", "text": '{"a": 1}'}], "structuredContent": {"a": 1}},
        {"content": [{"type": "text", "text": '{"result": "x"}'}], "structuredContent": {"result": "x"}},
        {"content": [{"type": "text", "text": "a"}], "structuredContent": {"result": "b"}},
        {"content": [{"type": "text", "text": "a"}], "structuredContent": {"result": 1}},
        {"content": [{"type": "text", "text": "a"}], "structuredContent": ["a"]},
        {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "a"}],
         "structuredContent": {"result": "a"}},
        {"content": [{"type": "text", "text": "a", "annotations": {"priority": 1}}]},
        {"content": [{"type": "text", "text": 5}]},
        {"content": [{"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"}]},
        {"content": [{"type": "text", "text": "a"}], "contents": [{"uri": "x", "text": "y"}]},
        {"content": [{"type": "text", "text": "x" * 70_000}], "nextCursor": "c", "_meta": {"k": [1, 2]}},
        {"content": [], "structuredContent": {"result": ""}},
        {"content": ("not", "a list")},
        {"structuredContent": {"result": "only"}},
    ]


@pytest.mark.parametrize("result", _results())
def test_single_text_fast_path_matches_the_general_rules(result: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = measure_result("tools/call", result, tool_name="t", policy=DEFAULT_POLICY).to_dict()
    monkeypatch.setattr(measure_module, "_single_text", lambda b, res: False)
    general = measure_result("tools/call", result, tool_name="t", policy=DEFAULT_POLICY).to_dict()
    assert fast == general


def test_the_common_result_takes_the_fast_path() -> None:
    b = measure_module._Builder(DEFAULT_POLICY)
    assert measure_module._single_text(b, _results()[0]) is True
    assert [blk.type for blk in b.blocks] == ["text", "structuredContent"]


@pytest.mark.parametrize(
    "value", [{"type": "text"}, {"isError": False}, {"isError": 0}, {"n": 1.0}, {"n": 1}, META, {}, {"x": None}]
)
def test_flat_size_cache_matches_a_fresh_estimate(value: dict[str, Any]) -> None:
    payload._flat_sizes.clear()
    first = payload.size_value(value, estimate_tokens)
    again = payload.size_value(value, estimate_tokens)  # from the cache
    skeleton = payload._flat_skeleton(value)
    assert skeleton is not None
    assert first == again == payload.Size(estimate_tokens(skeleton), len(skeleton.encode()))


def test_booleans_and_integers_never_share_a_cached_size() -> None:
    payload._flat_sizes.clear()
    assert payload.size_value({"isError": False}, estimate_tokens).bytes == len('{"isError":false}')
    assert payload.size_value({"isError": 0}, estimate_tokens).bytes == len('{"isError":0}')


def test_budget_updates_without_a_transition_match_the_full_rule() -> None:
    budget = SessionBudget(1000, 0.5, 0.9)
    states = []
    for tokens in (100, 300, 99, 1, 400, 0, -5, 200):
        update = budget.record(tokens)
        states.append((update.tokens, update.utilization, update.state, update.transitions))
    assert states == [
        (100, 0.1, "ok", ()),
        (400, 0.4, "ok", ()),
        (499, 0.499, "ok", ()),
        (500, 0.5, "warning", ("warning",)),
        (900, 0.9, "exhausted", ("exhausted",)),
        (900, 0.9, "exhausted", ()),
        (900, 0.9, "exhausted", ()),
        (1100, 1.1, "exhausted", ()),
    ]
    jump = SessionBudget(1000, 0.5, 0.9)
    assert jump.record(950).transitions == ("warning", "exhausted")
