"""Bad input gets an answer, never an exception: the walker behind every measurement."""

from __future__ import annotations

import json
import math

import pytest

from mcp_token_otel.core.estimation import estimate_tokens
from mcp_token_otel.core.payload import MAX_NODES, size_text, size_value, utf8_len
from tests.conftest import chars4


def test_plain_json_matches_compact_serialisation() -> None:
    value = {"a": [1, 2.5, True, None], "b": {"c": "d"}}
    size = size_value(value, chars4)
    compact = '{"a":[1,2.5,true,null],"b":{"c":"d"}}'
    assert size.bytes == len(compact)
    assert size.tokens == math.ceil(len(compact) / 4) and size.reason is None


def test_long_strings_are_estimated_apart_and_not_copied() -> None:
    big = "x" * 100_000_000
    size = size_value({"text": big}, chars4)
    assert size.tokens == 25_000_000 + math.ceil(len('{"text":""}') / 4)
    assert size.bytes == 100_000_000 + len('{"text":""}')


def test_circular_reference_is_skipped_with_a_reason() -> None:
    a: dict = {"name": "loop"}
    a["self"] = a
    size = size_value(a, chars4)
    assert size.tokens > 0 and size.reason == "circular reference skipped"


def test_shared_reference_is_counted_twice_like_json() -> None:
    shared = {"k": "v" * 10}
    size = size_value([shared, shared], chars4)
    assert size.reason is None
    assert size.bytes == len('[{"k":"vvvvvvvvvv"},{"k":"vvvvvvvvvv"}]')


def test_ten_thousand_deep_nesting() -> None:
    root: list = []
    cur = root
    for _ in range(10_000):
        nxt: list = []
        cur.append(nxt)
        cur = nxt
    size = size_value(root, chars4)
    assert size.bytes == 20_002 and size.reason is None


def test_past_the_node_budget_the_value_is_sized_from_its_json() -> None:
    value = list(range(MAX_NODES * 2))
    size = size_value(value, chars4)
    text = json.dumps(value, separators=(",", ":"))
    assert size.bytes == len(text) and size.tokens == math.ceil(len(text) / 4) and size.reason is None


def test_fifty_thousand_rows_within_ten_percent_of_the_serialised_json() -> None:
    """The layout issue's case: 50,000 structuredContent rows measured -34% when the walk stopped."""
    rows = [
        {"id": i, "name": f"user {i}", "email": f"user{i}@example.com", "active": i % 3 == 0, "score": i / 7}
        for i in range(50_000)
    ]
    size = size_value(rows, estimate_tokens)
    reference = estimate_tokens(json.dumps(rows, separators=(",", ":")))
    assert abs(size.tokens - reference) / reference < 0.10 and size.reason is None


def test_a_value_json_cannot_write_stops_at_the_bound_and_says_it_undercounts() -> None:
    wide = {(i, "tuple key"): i for i in range(MAX_NODES * 3)}  # JSON has no tuple keys
    size = size_value({"rows": wide}, chars4)
    assert size.tokens > 0 and size.reason is not None and "undercount" in size.reason


@pytest.mark.slow
def test_wide_containers_are_refused_before_they_are_expanded() -> None:
    """A 3M-key dict is never copied item by item into the walker: the bound applies before expansion."""
    import mcp_token_otel.core.payload as payload

    calls = 0
    original = payload._push_mapping

    def counting(stack: list, mapping: dict, limit: int) -> bool:
        nonlocal calls
        calls += 1
        return original(stack, mapping, limit)

    payload._push_mapping = counting  # type: ignore[assignment]
    try:
        size = size_value({f"k{i}": i for i in range(3_000_000)}, chars4)
    finally:
        payload._push_mapping = original  # type: ignore[assignment]
    assert calls == 0 and size.reason is None and size.bytes > 3_000_000 * 6


def test_odd_types_keys_bytes_and_surrogates() -> None:
    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no")

    value = {1: "int key", (2, 3): "tuple key", None: b"\x00\xff" * 10, "s": "\ud800\udfff lone",
             "obj": Unprintable(), Unprintable(): 1, "set": {1}}
    size = size_value(value, chars4)
    assert size.tokens > 0 and size.bytes > 0


def test_pydantic_models_are_dumped_by_alias() -> None:
    from pydantic import BaseModel, Field

    class Res(BaseModel):
        is_error: bool = Field(alias="isError")

    assert size_value(Res(isError=True), chars4).bytes == len('{"isError":true}')


def test_utf8_len_samples_huge_non_ascii_strings() -> None:
    assert utf8_len("é" * 10) == 20
    assert utf8_len("\ud800") == 3
    huge = "日本" * 3_000_000
    assert abs(utf8_len(huge) - 18_000_000) < 18_000
    assert size_text("", chars4).tokens == 0


def test_values_that_convert_to_themselves_cannot_loop() -> None:
    class SelfStr(str):
        def __str__(self) -> str:
            return self

    class SelfDump:
        def model_dump(self, **_: object) -> object:
            return self

        def __str__(self) -> str:
            return "self-dump"

    size = size_value({"q": SelfStr("abc"), "m": SelfDump(), "n": [SelfStr("x")] * 3}, chars4)
    assert size.bytes == len('{"q":"abc","m":"self-dump","n":["x","x","x"]}') and size.reason is None


def test_nested_small_dicts_take_the_fast_path_and_match_compact_json() -> None:
    value = {"io.modelcontextprotocol/serverInfo": {"name": "bench", "version": ""}, "n": 1}
    size = size_value(value, chars4)
    assert size.bytes == len(json.dumps(value, separators=(",", ":"))) and size.reason is None
