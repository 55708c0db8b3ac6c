"""The hot path's shortcuts give exactly what the general rules give (measure fast paths, size caches, budgets).

Each shortcut is compared with the general computation it stands for: the measure fast paths switched off and
the size caches replaced by fresh estimates, over many shapes, several estimators (switched back and forth) and
caches forced to evict.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from mcp_token_otel.core import estimation, measurement, payload
from mcp_token_otel.core import measure as measure_module
from mcp_token_otel.core.budget import SessionBudget
from mcp_token_otel.core.estimation import estimate_tokens
from mcp_token_otel.core.measure import DEFAULT_POLICY, Policy, measure_request, measure_result
from tests.conftest import chars4

TEXT = ("lorem ipsum dolor sit amet, " * 80)[:2048]
META = {"io.modelcontextprotocol/serverInfo": {"name": "bench", "version": ""}}


def utf8_third(text: str) -> int:
    """An estimator that sees bytes, so non-ASCII text sizes differently from chars/4."""
    return len(text.encode("utf-8", "surrogatepass")) // 3 + 1


POLICIES = [
    DEFAULT_POLICY,
    Policy(estimator=chars4, estimator_name="chars/4"),
    Policy(estimator=utf8_third, estimator_name="utf8/3"),
]


@contextmanager
def general_rules() -> Iterator[None]:
    """Every measure fast path off and every size cache replaced by a fresh estimate."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(measure_module, "_single_text", lambda b, res: False)
        mp.setattr(measure_module, "_result_fields", lambda b, rest: b.value(rest))
        mp.setattr(measure_module, "_tool_call_request", lambda params, policy: None)
        mp.setattr(payload, "_short_size", lambda text, est: payload.Size(est(text), payload.utf8_len(text)))
        mp.setattr(payload, "estimate_cached", lambda text, est: est(text))
        yield


def _general_result(result: Any, policy: Policy) -> dict[str, Any]:
    with general_rules():
        return measure_result("tools/call", result, tool_name="t", policy=policy).to_dict()


def _general_request(params: Any, policy: Policy, method: str = "tools/call") -> dict[str, Any]:
    with general_rules():
        return measure_request(method, params, policy).to_dict()


# -- results ------------------------------------------------------------------------------------------------


def _results() -> list[Any]:
    copy = "".join(list(TEXT))  # an equal string that is not the same object, as after serialisation
    return [
        {"content": [{"type": "text", "text": TEXT}], "isError": False, "resultType": "complete",
         "structuredContent": {"result": copy}, "_meta": META},
        {"content": [{"type": "text", "text": TEXT}], "structuredContent": {"result": TEXT}, "isError": False},
        # The serverInfo stamp alone (cached per stamp), one with a nested value (not cacheable), one beside others.
        {"content": [{"type": "text", "text": "a"}], "isError": True, "resultType": "complete",
         "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "s", "version": "1.0"}}},
        {"content": [{"type": "text", "text": "a"}], "isError": False, "resultType": "complete",
         "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "s", "icons": [{"src": "x"}]}}},
        {"content": [{"type": "text", "text": "a"}], "resultType": "input_required",
         "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "s"}, "k": 1}},
        {"content": [{"type": "text", "text": TEXT}], "structuredContent": {"result": copy}, "isError": True},
        {"content": [{"type": "text", "text": TEXT}], "isError": True},
        {"content": [{"type": "text", "text": TEXT}], "isError": 0},
        {"content": [{"type": "text", "text": TEXT}], "isError": 1},
        {"content": [{"type": "text", "text": TEXT}], "isError": None},
        {"content": [{"type": "text", "text": TEXT}], "isError": "false"},
        {"content": [{"type": "text", "text": TEXT}], "isError": False, "nextCursor": "c"},
        {"content": [{"type": "text", "text": ""}], "structuredContent": {"result": ""}},
        {"content": [{"type": "text", "text": "héllo ✓ 你好"}], "structuredContent": {"result": "héllo ✓ 你好"}},
        {"content": [{"type": "text", "text": "\ud800 lone"}], "isError": False},
        {"content": [{"type": "text", "text": '{"a": 1}'}], "structuredContent": {"a": 1}},
        {"content": [{"type": "text", "text": '{"result": "x"}'}], "structuredContent": {"result": "x"}},
        {"content": [{"type": "text", "text": "a"}], "structuredContent": {"result": "b"}},
        {"content": [{"type": "text", "text": "a"}], "structuredContent": {"result": 1}},
        {"content": [{"type": "text", "text": "a"}], "structuredContent": ["a"]},
        {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "a"}],
         "structuredContent": {"result": "a"}},
        {"content": [{"type": "text", "text": "a", "annotations": {"priority": 1}}]},
        {"content": [{"text": "a", "type": "text"}], "isError": False},
        {"content": [{"type": "text", "text": 5}]},
        {"content": [{"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"}]},
        {"content": [{"type": "text", "text": "a"}], "contents": [{"uri": "x", "text": "y"}]},
        {"content": [{"type": "text", "text": "x" * 70_000}], "nextCursor": "c", "_meta": {"k": [1, 2]}},
        {"content": [], "structuredContent": {"result": ""}},
        {"content": ("not", "a list")},
        {"structuredContent": {"result": "only"}},
        {"isError": False},
        {"isError": True},
        {},
    ]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.estimator_name)
@pytest.mark.parametrize("result", _results())
def test_result_fast_paths_match_the_general_rules(result: Any, policy: Policy) -> None:
    fast = measure_result("tools/call", result, tool_name="t", policy=policy).to_dict()
    assert fast == _general_result(result, policy)


def _random_result(rng: random.Random) -> dict[str, Any]:
    texts = ["", "a", TEXT, "".join(list(TEXT)), "héllo ✓ 你好 " * 30, "x" * 300, '{"a": [1, 2]}', "\ud800x", 7]
    text = rng.choice(texts)
    block = rng.choice([
        {"type": "text", "text": text},
        {"text": text, "type": "text"},
        {"type": "text", "text": text, "annotations": {"audience": ["user"]}},
        {"type": "text"},
        {"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"},
    ])
    result: dict[str, Any] = {}
    content = rng.choice([[block], [block, {"type": "text", "text": "b"}], [], None, "missing"])
    if content != "missing":
        result["content"] = content
    structured = rng.choice([
        "missing", {"result": text}, {"result": "".join(list(text)) if isinstance(text, str) else text},
        {"result": "other"}, {"result": 1}, {"a": 1}, [], None, {"result": text, "x": 1},
    ])
    if structured != "missing":
        result["structuredContent"] = structured
    for key, choices in (
        ("isError", ["missing", False, True, 0, 1, None, "false", -0.0, 0.0]),
        ("resultType", ["missing", "missing", "complete"]),
        ("nextCursor", ["missing", "missing", "c"]),
        ("_meta", ["missing", "missing", META, {"k": [1, 2]}, {}]),
    ):
        value = rng.choice(choices)
        if value != "missing":
            result[key] = value
    keys = list(result)
    rng.shuffle(keys)
    return {k: result[k] for k in keys}


@pytest.mark.parametrize("seed", range(4))
def test_random_results_match_the_general_rules(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(150):
        result = _random_result(rng)
        policy = rng.choice(POLICIES)  # estimators switched back and forth between calls
        fast = measure_result("tools/call", result, tool_name="t", policy=policy).to_dict()
        assert fast == _general_result(result, policy), result


def test_the_common_result_takes_the_fast_path() -> None:
    b = measurement.Builder(DEFAULT_POLICY)
    assert measure_module._single_text(b, _results()[0]) is True
    assert [blk.type for blk in b.blocks] == ["text", "structuredContent"]


def test_framing_sizes_are_the_general_sizes_for_each_estimator() -> None:
    for policy in POLICIES * 2:
        estimator = policy.estimator
        framing = measure_module._framing(estimator)
        assert framing.text_block == payload.size_value({"type": "text"}, estimator)
        assert framing.result_wrapper == payload.size_value({"result": ""}, estimator)
        assert framing.is_error == payload.size_value({"isError": True}, estimator)
        assert framing.not_error == payload.size_value({"isError": False}, estimator)
        assert framing.not_error.bytes == len('{"isError":false}')


def _scaled(divisor: int) -> Callable[[str], int]:
    return lambda text: len(text) // divisor + 1


def test_framing_cache_eviction_keeps_every_answer_right(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(measure_module, "_FRAMINGS_MAX", 2)
    measure_module._framings.clear()
    policies = [Policy(estimator=_scaled(d), estimator_name=f"/{d}") for d in range(1, 6)]
    result = _results()[1]
    for round_ in range(3):
        for policy in policies if round_ % 2 == 0 else reversed(policies):
            fast = measure_result("tools/call", result, tool_name="t", policy=policy).to_dict()
            assert fast == _general_result(result, policy)
            assert len(measure_module._framings) <= 2


# -- requests -----------------------------------------------------------------------------------------------


class _Name(str):
    pass


def _cyclic() -> dict[str, Any]:
    loop: dict[str, Any] = {"a": 1}
    loop["self"] = loop
    return loop


_NAMES: list[Any] = ["fetch", "", "héllo✓你好", "x" * 300, "\ud800", _Name("fetch"), 5, None, "missing"]
_ARGUMENTS: list[Any] = [
    "missing", None, {}, {"url": "https://example.com/a", "max": 5}, {"nested": {"a": [1, 2]}},
    {"big": "x" * 1000}, {"f": -0.0}, {"f": 0.0}, {"b": True}, {"i": 1}, {"s": "é"}, [], "text",
    {f"k{i}": i for i in range(25_000)}, _cyclic(),
]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.estimator_name)
@pytest.mark.parametrize("name", _NAMES, ids=repr)
def test_tool_call_request_fast_path_matches_the_general_rule(name: Any, policy: Policy) -> None:
    for arguments in _ARGUMENTS:
        params: dict[str, Any] = {"_meta": {"progressToken": 1}}
        if name != "missing":
            params["name"] = name
        if not (isinstance(arguments, str) and arguments == "missing"):
            params["arguments"] = arguments
        fast = measure_request("tools/call", params, policy).to_dict()
        assert fast == _general_request(params, policy), params


def test_a_cyclic_argument_keeps_its_reason_on_the_fast_path() -> None:
    fast = measure_request("tools/call", {"name": "t", "arguments": _cyclic()})
    assert fast.reason == "circular reference skipped"
    assert measure_module._tool_call_request({"name": "t", "arguments": {}}, DEFAULT_POLICY) is not None


# -- size caches --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", [{"type": "text"}, {"isError": False}, {"isError": 0}, {"n": 1.0}, {"n": 1}, META, {}, {"x": None}]
)
def test_flat_size_cache_matches_a_fresh_estimate(value: dict[str, Any]) -> None:
    payload._short_sizes.clear()
    first = payload.size_value(value, estimate_tokens)
    again = payload.size_value(value, estimate_tokens)  # from the cache
    skeleton = payload._flat_skeleton(value)
    assert skeleton is not None
    assert first == again == payload.Size(estimate_tokens(skeleton), len(skeleton.encode()))


def test_booleans_and_integers_never_share_a_cached_size() -> None:
    payload._short_sizes.clear()
    assert payload.size_value({"isError": False}, estimate_tokens).bytes == len('{"isError":false}')
    assert payload.size_value({"isError": 0}, estimate_tokens).bytes == len('{"isError":0}')


@pytest.mark.parametrize("text", ["fetch", "héllo ✓ 你好", "\ud800", '{"type":"text"}', "x" * 256, "x" * 257, ""])
def test_short_text_cache_matches_a_fresh_estimate(text: str) -> None:
    payload._short_sizes.clear()
    for estimator in (estimate_tokens, chars4, utf8_third, estimate_tokens):
        expected = payload.Size(estimator(text), len(text.encode("utf-8", "surrogatepass"))) if text else payload.ZERO
        assert payload.size_text(text, estimator) == expected
        assert payload.size_text(text, estimator) == expected  # again, from the cache


def test_short_size_cache_eviction_keeps_every_answer_right(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(payload, "_SHORT_CACHE_MAX", 3)
    payload._short_sizes.clear()
    for i in range(40):
        estimator = (estimate_tokens, chars4, utf8_third)[i % 3]
        name = f"tool_{i % 7}é" if i % 2 else f"tool_{i % 5}"
        params = {"name": name, "arguments": {"n": i % 4}}
        assert measure_request("tools/call", params, Policy(estimator=estimator)).to_dict() == _general_request(
            params, Policy(estimator=estimator)
        )
        assert len(payload._short_sizes) <= 3


# -- the estimator ------------------------------------------------------------------------------------------


def _reference_score(text: str) -> float:
    """The estimator's rule spelt out: the byte weights' sum plus every pattern counted on the class bytes."""
    raw = text.encode("utf-8", "surrogatepass")
    total = sum(raw.translate(estimation.WEIGHT_TABLE)) / estimation._WEIGHT_SCALE
    classes = raw.translate(estimation.CLASS_TABLE)
    for pattern, weight in estimation._ASCII_PAIRS:
        total += weight * classes.count(pattern)
    if len(raw) != len(text):
        for pattern, weight in estimation._NON_ASCII_RUNS:
            total += weight * classes.count(pattern)
    return total


def _estimator_texts() -> list[str]:
    rng = random.Random(11)
    ascii_chars = [chr(i) for i in range(128)]
    pools = [
        ascii_chars,
        [c for c in ascii_chars if not c.isdigit()],  # no digit: the "A0" count is skipped
        [c for c in ascii_chars if not c.isupper()],
        list("abc XYZ 019 .,;\"\n\t"),
        list("<a href=\"/x_y\">(-)</a>\n kzj"),  # the markup and rare-letter classes
        ascii_chars + list("éß✓你好한😀\u0301"),
        list("Привет мир, это тест."),  # no CJK, no emoji: those runs are skipped
        list("Привет\n   мир -- <b> jak"),  # the same classes in non-ASCII text
        list("你好世界，这是一个测试。"),  # no 2-byte characters
        list("ab 😀é."),
        [*"你好한😀 a", "\ud800"],
    ]
    texts = [TEXT, "".join(ascii_chars) * 20, "A0 .A0 ." * 300, "ID A1B2C3 ok. x ." * 90]
    chunk = estimation._SUM_CHUNK  # the adler32 sums' chunk boundaries
    edges = [chunk - 1, chunk, chunk + 1, 2 * chunk - 1, 2 * chunk, 2 * chunk + 1]
    for n in [*range(0, 64), 255, 256, 257, *edges, 1039, 1040, 1041, 2079, 2080, 2081, 4000]:
        for pool in pools:
            texts.append("".join(rng.choice(pool) for _ in range(n)))
    return texts


def test_estimator_fast_counts_equal_the_rule_exactly() -> None:
    assert estimation._ASCII_PAIRS_ON_WEIGHTS is not None  # the shipped weights take the ASCII fast path
    for text in _estimator_texts():
        assert estimation._score(text) == _reference_score(text), repr(text[:40])


def test_estimator_without_the_ascii_fast_path_gives_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    texts = _estimator_texts()
    fast = [estimation._score(t) for t in texts]
    monkeypatch.setattr(estimation, "_ASCII_PAIRS_ON_WEIGHTS", None)
    assert [estimation._score(t) for t in texts] == fast


def test_sampled_long_text_is_estimated_as_before() -> None:
    rng = random.Random(3)
    for pool in ("abc DEF 123 .,\n", "abc é 你好 ."):
        text = "".join(rng.choice(pool) for _ in range(estimation.SAMPLE_THRESHOLD + 5000))
        n, chunk = len(text), estimation.SAMPLE_CHUNK if text.isascii() else estimation.SAMPLE_CHUNK_NON_ASCII
        step = (n - chunk) // (estimation.SAMPLE_CHUNKS - 1)
        sample = "".join(text[i * step : i * step + chunk] for i in range(estimation.SAMPLE_CHUNKS))
        assert estimate_tokens(text) == max(1, int(_reference_score(sample) * n / len(sample) + 0.5))


def test_weight_bytes_shared_by_two_ascii_classes_turn_the_fast_path_off(monkeypatch: pytest.MonkeyPatch) -> None:
    table = bytearray(estimation.WEIGHT_TABLE)
    table[ord("A")] = table[ord("a")]  # upper and lower case would become indistinguishable
    monkeypatch.setattr(estimation, "WEIGHT_TABLE", bytes(table))
    assert estimation._pairs_on_weight_bytes() is None


# -- budgets ------------------------------------------------------------------------------------------------


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
