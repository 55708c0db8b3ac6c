"""Property tests of the response cap: a cut never exceeds the cap by more than the notice, never produces
invalid UTF-8 or invalid JSON, and structuredContent still validates against the tool's outputSchema."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_token_otel.core.estimation import estimate_tokens
from mcp_token_otel.core.guard import GuardEngine, GuardSettings, cap_result, cut_text, json_prefix
from mcp_token_otel.core.guard import cap as cap_module
from mcp_token_otel.core.measure import DEFAULT_POLICY, measure_result

# Hundreds of examples per property: the full run has them, the fast tier has the example-based tests.
pytestmark = pytest.mark.slow

# Text that stresses the boundaries: escapes, quotes, astral characters, CJK, combining marks, newlines.
PIECES = st.sampled_from([
    "a", "word ", "\\", "\\u00e9", '\\"', '"', "u", "00", "\n", "\t", "é", "\u0301", "中文", "😀", "👨\u200d👩",
    "\ud83d\ude00",  # a surrogate pair as two code points (UTF-16 decoded with surrogatepass)
    "{", "}", "[", "]", ",", ":", "0123456789", " ",
])
TEXT = st.lists(PIECES, max_size=400).map("".join)


def encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def dangling_escape(prefix: str) -> bool:
    """The prefix ends inside a backslash escape (an odd run of backslashes, or \\u with < 4 hex digits)."""
    tail = prefix[-6:]
    at = tail.rfind("\\")
    if at < 0:
        return False
    start = len(prefix) - len(tail) + at
    run = 0
    while start - run - 1 >= 0 and prefix[start - run - 1] == "\\":
        run += 1
    if run % 2:  # this backslash is itself escaped
        return False
    rest = prefix[start + 1 :]
    return rest == "" or (rest[0] == "u" and len(rest) < 5)


@settings(max_examples=300, deadline=None)
@given(TEXT, st.integers(min_value=0, max_value=300))
def test_cut_text_is_a_safe_prefix_within_the_budget(text: str, budget: int) -> None:
    prefix, tokens = cut_text(text, budget, estimate_tokens)
    assert text.startswith(prefix)
    assert tokens == estimate_tokens(prefix) <= budget
    if len(prefix) < len(text):
        assert not ("\ud800" <= prefix[-1:] <= "\udbff" and "\udc00" <= text[len(prefix)] <= "\udfff")
        assert not dangling_escape(prefix)
    if encodes(text):
        assert encodes(prefix)
    json.loads(json.dumps(prefix, ensure_ascii=False))  # valid JSON (a surrogate pair comes back joined)


JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | TEXT,
    lambda children: st.lists(children, max_size=8) | st.dictionaries(TEXT, children, max_size=5),
    max_leaves=60,
)
BLOCK = st.one_of(
    TEXT.map(lambda t: {"type": "text", "text": t}),
    st.tuples(JSON_VALUE, st.booleans()).map(
        lambda v: {"type": "text", "text": json.dumps(v[0], indent=2 if v[1] else None, ensure_ascii=False)}),
    st.integers(min_value=1, max_value=4000).map(lambda n: {"type": "image", "data": "QUJD" * n,
                                                            "mimeType": "image/png"}),
    st.just({"type": "resource_link", "uri": "file:///x", "name": "x"}),
    TEXT.map(lambda t: {"type": "resource", "resource": {"uri": "file:///r", "text": t}}),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(BLOCK, min_size=1, max_size=6), st.integers(min_value=1, max_value=400))
def test_cut_result_stays_within_cap_plus_notices_and_is_valid(blocks: list[dict[str, Any]], cap: int) -> None:
    result = {"content": blocks, "isError": False}
    before = copy.deepcopy(result)
    new, report = cap_result(result, cap, policy=DEFAULT_POLICY, tool="t")
    assert result == before
    if new is None:
        assert measure_result("tools/call", result).data_tokens <= cap
        return
    after = measure_result("tools/call", new)
    assert report.over_cap_tokens == 0  # no schema floors on plain content
    assert after.data_tokens <= cap + report.notice_tokens
    wire = json.dumps(new, ensure_ascii=False)
    assert json.loads(wire) == new
    if encodes(json.dumps(result, ensure_ascii=False)):
        wire.encode("utf-8")  # strict: no lone surrogate was produced


ITEM = st.fixed_dictionaries({"id": st.integers(0, 10**6), "name": TEXT.filter(encodes)},
                             optional={"tags": st.lists(st.sampled_from(["a", "bb", "ccc"]), max_size=4)})


@settings(max_examples=200, deadline=None)
@given(st.lists(ITEM, max_size=60), st.integers(min_value=0, max_value=5), st.integers(min_value=1, max_value=300),
       st.booleans(), st.booleans())
def test_structured_content_still_validates_after_a_cut(
    items: list[dict[str, Any]], min_items: int, cap: int, duplicate: bool, wrapped: bool
) -> None:
    item_schema = {"type": "object", "required": ["id", "name"], "additionalProperties": False,
                   "properties": {"id": {"type": "integer"}, "name": {"type": "string"},
                                  "tags": {"type": "array", "items": {"type": "string"}}}}
    array = {"type": "array", "minItems": min(min_items, len(items)), "items": {"$ref": "#/$defs/Item"}}
    key = "result" if wrapped else "items"
    schema = {"type": "object", "required": [key], "additionalProperties": False, "properties": {key: array},
              "$defs": {"Item": item_schema}}
    structured = {key: items}
    jsonschema.validate(structured, schema)
    text = json.dumps(items if wrapped else structured)
    content = [{"type": "text", "text": text if duplicate else "see structuredContent"}]
    result = {"content": content, "structuredContent": structured}
    engine = GuardEngine(GuardSettings(mode="enforce", max_response_tokens=cap))
    engine.learn_tools({"tools": [{"name": "t", "inputSchema": {"type": "object"}, "outputSchema": schema}]})
    outcome = engine.on_result("tools/call", result, tool="t")
    new = outcome.result
    jsonschema.validate(new["structuredContent"], schema)
    if outcome.actions:
        numbers = outcome.actions[0].numbers
        allowed = cap + int(numbers["notice_tokens"]) + int(numbers["over_cap_tokens"])
        assert measure_result("tools/call", new).data_tokens <= allowed
    kept = new["structuredContent"][key]
    assert kept == items[: len(kept)]  # whole items, from the start
    if duplicate:
        assert json.loads(new["content"][0]["text"]) == (kept if wrapped else new["structuredContent"])
    json.loads(json.dumps(new))


def _nest(depth: int, leaf: Any) -> Any:
    value = leaf
    for level in range(depth):
        value = [value, level] if level % 2 else {"d": value, "n": level}
    return value


# Shapes the array-and-string cut alone could not bring under the cap: more than 64 arrays, deeper than 6
# levels, only short values. The fallback (a document-order prefix) must.
WIDE_OR_DEEP = st.one_of(
    st.integers(65, 200).map(lambda n: {f"a{i}": [i, "x" * (i % 7)] for i in range(n)}),
    st.tuples(st.integers(7, 60), TEXT.filter(encodes)).map(lambda t: {"deep": _nest(*t)}),
    st.integers(100, 3000).map(lambda n: {f"k{i}": i if i % 3 else f"v{i}" for i in range(n)}),
    st.integers(100, 3000).map(lambda n: [[i] for i in range(n)]),
)
# Objects and arrays: a text block that is a JSON scalar ('"aa"') is prose to the cut, as documented
# (docs/guardrails.md: "a text block that is a JSON object or array is cut as JSON").
JSON_CONTAINER = JSON_VALUE.filter(lambda v: isinstance(v, (list, dict)))
JSON_BLOCK = st.tuples(st.one_of(WIDE_OR_DEEP, JSON_CONTAINER), st.booleans()).map(
    lambda v: {"type": "text", "text": json.dumps(v[0], indent=2 if v[1] else None, ensure_ascii=False)})


def is_notice(block: dict[str, Any]) -> bool:
    return block.get("type") == "text" and block["text"].lstrip("\n").startswith("[mcp-token-otel")


@settings(max_examples=150, deadline=None)
@given(st.lists(JSON_BLOCK, min_size=1, max_size=4), st.integers(min_value=1, max_value=600))
def test_wide_and_deep_json_text_is_cut_to_the_cap_as_valid_json(blocks: list[dict[str, Any]], cap: int) -> None:
    result = {"content": blocks}
    new, report = cap_result(result, cap, policy=DEFAULT_POLICY, tool="t")
    if new is None:
        return
    assert report.over_cap_tokens == 0 and not report.json_as_text
    assert measure_result("tools/call", new).data_tokens <= cap + report.notice_tokens
    for block in new["content"]:
        if not is_notice(block):
            json.loads(block["text"])  # every JSON text block that is kept is still JSON
    if encodes(json.dumps(result, ensure_ascii=False)):
        json.dumps(new, ensure_ascii=False).encode("utf-8")  # strict: no lone surrogate was produced


@settings(max_examples=150, deadline=None)
@given(WIDE_OR_DEEP.filter(lambda v: isinstance(v, dict)), st.integers(min_value=1, max_value=600), st.booleans())
def test_wide_and_deep_structured_content_without_schema_is_cut_to_the_cap(
    value: dict[str, Any], cap: int, duplicate: bool
) -> None:
    text = json.dumps(value, ensure_ascii=False) if duplicate else "see structuredContent"
    result = {"content": [{"type": "text", "text": text}], "structuredContent": value}
    new, report = cap_result(result, cap, policy=DEFAULT_POLICY, tool="t")
    if new is None:
        return
    assert report.over_cap_tokens == 0
    assert measure_result("tools/call", new).data_tokens <= cap + report.notice_tokens
    assert isinstance(new["structuredContent"], dict)  # still an object, as MCP requires
    if duplicate:
        assert json.loads(new["content"][0]["text"]) == new["structuredContent"]
    json.loads(json.dumps(new, ensure_ascii=False))


@settings(max_examples=300, deadline=None)
@given(st.one_of(WIDE_OR_DEEP, JSON_VALUE).filter(lambda v: isinstance(v, (dict, list))), st.booleans(), st.data())
def test_close_json_prefix_is_valid_json_wherever_the_text_is_cut(value: Any, indent: bool, data: Any) -> None:
    text = json.dumps(value, indent=2 if indent else None, ensure_ascii=False)
    end = data.draw(st.integers(0, len(text)))
    closed = json_prefix.close_json_prefix(text, end)
    if end > 0:  # a JSON object or array can always be closed once its first bracket is in
        assert closed is not None
    if closed is not None:
        json.loads(closed)
        assert len(closed) <= len(text) and (closed == text or not text.startswith(closed))


@settings(max_examples=100, deadline=None)
@given(st.lists(JSON_BLOCK, min_size=1, max_size=4), st.integers(min_value=1, max_value=600))
def test_json_text_cut_without_parsing_is_valid_and_within_the_cap(
    blocks: list[dict[str, Any]], cap: int
) -> None:
    # The path for JSON text too large (or deep) to parse, forced here by a zero parse threshold.
    saved = cap_module._PARSE_ALWAYS_CHARS, cap_module._PARSE_BUDGET_FACTOR
    cap_module._PARSE_ALWAYS_CHARS, cap_module._PARSE_BUDGET_FACTOR = 0, 0
    try:
        new, report = cap_result({"content": blocks}, cap, policy=DEFAULT_POLICY, tool="t")
    finally:
        cap_module._PARSE_ALWAYS_CHARS, cap_module._PARSE_BUDGET_FACTOR = saved
    if new is None:
        return
    assert report.over_cap_tokens == 0 and not report.json_as_text
    assert measure_result("tools/call", new).data_tokens <= cap + report.notice_tokens
    for block in new["content"]:
        if not is_notice(block):
            json.loads(block["text"])
