"""Property tests of the spill: for any text, pages concatenate to it byte for byte and each fits its budget;
for any JSON array, each page is valid JSON and together they hold its items; spill URIs round trip and
anything else is rejected; the store agrees with a model of TTL, byte cap, LRU and ownership."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule

from mcp_token_otel.core.estimation import estimate_tokens
from mcp_token_otel.core.measure import measure_result
from mcp_token_otel.core.spill import (
    EXPIRED,
    FORBIDDEN,
    ITEMS,
    NOT_FOUND,
    SERVED,
    MemorySpillStore,
    SpillRef,
    SpillUriError,
    build_spill,
    parse_spill_uri,
    spill_uri,
)
from tests.helpers.spill_support import part_items, part_texts, read_all

# Hundreds of examples per property: the full run has them, the fast tier has the example-based tests.
pytestmark = pytest.mark.slow

# Text that stresses the boundaries: astral characters, surrogate pairs, combining marks, ZWJ sequences, CRLF.
PIECES = st.sampled_from([
    "a", "word ", "\n", "\r\n", "\r", "\t", " ", "é", "e\u0301", "\u0301", "中文", "😀", "👨\u200d👩", "\u200d",
    "\ufe0f", "\U000e0100", "\ud83d\ude00", "\ud800", "🇫🇷", "\u0915\u094d\u0937", "0123456789", '"', "\\", "{}",
    "Ω" * 40, "x" * 300,
])
TEXT = st.one_of(st.lists(PIECES, max_size=300).map("".join), st.text(max_size=3000))
#: Clusters that cannot be cut inside are kept whole: a page may exceed its budget by one of them, never more.
CLUSTER_CHARS = 64


def utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def within(page: dict[str, Any], budget: int) -> bool:
    """A page fits its budget as measuring the read counts it; the only exceptions are alone on their page: a
    blob (it cannot be cut) or one cluster of characters that does not fit even alone."""
    if measure_result("resources/read", page).data_tokens <= budget:
        return True
    contents = page["contents"]
    return len(contents) == 1 and ("blob" in contents[0] or len(contents[0]["text"]) <= CLUSTER_CHARS)


@settings(max_examples=400, deadline=None)
@given(TEXT, st.integers(min_value=1, max_value=400))
def test_text_pages_concatenate_byte_for_byte_within_the_budget(text: str, budget: int) -> None:
    spill = build_spill({"content": [{"type": "text", "text": text}]}, budget, tokens=0)
    pages = read_all(spill)
    assert utf8("".join(part_texts(pages).get(0, []))) == utf8(text)
    for page in pages:
        (item,) = page["contents"]
        tokens = estimate_tokens(item["text"])
        assert tokens == page["_meta"]["io.github.mcp-token-otel/spill"]["tokens"]
        assert within(page, budget)


JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                         TEXT)
JSON = st.recursive(JSON_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                          st.dictionaries(st.text(max_size=8), inner, max_size=5)),
                    max_leaves=30)
STYLES = st.sampled_from([{}, {"separators": (",", ":")}, {"indent": 2}, {"indent": "\t"}, {"ensure_ascii": False}])


@settings(max_examples=300, deadline=None)
@given(st.lists(JSON, max_size=60), STYLES, st.integers(min_value=4, max_value=300))
def test_json_array_pages_are_valid_json_and_hold_every_item(items: list[Any], style: dict[str, Any],
                                                             budget: int) -> None:
    text = json.dumps(items, **style)
    spill = build_spill({"content": [{"type": "text", "text": text}]}, budget, tokens=0)
    assert spill.parts[0].kind == ITEMS
    pages = read_all(spill)
    got = part_items(pages, 0)
    for page in pages:
        for piece in page["contents"]:
            if "items" in piece["_meta"]["io.github.mcp-token-otel/spill"]:
                assert estimate_tokens(piece["text"]) <= budget  # whole items: always within the budget
        assert within(page, budget)
    assert got == json.loads(text)


BLOCK = st.one_of(
    TEXT.map(lambda t: {"type": "text", "text": t}),
    st.lists(JSON, max_size=20).map(lambda v: {"type": "text", "text": json.dumps(v)}),
    st.just({"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}),
    TEXT.map(lambda t: {"type": "resource", "resource": {"uri": "file:///x", "mimeType": "text/x", "text": t}}),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(BLOCK, min_size=1, max_size=12), st.integers(min_value=2, max_value=200))
def test_every_block_of_a_result_is_kept_in_order(blocks: list[dict[str, Any]], budget: int) -> None:
    spill = build_spill({"content": blocks}, budget, tokens=0)
    pages = read_all(spill)
    texts = part_texts(pages)
    assert sorted(texts) == list(range(len(blocks)))
    assert all(within(page, budget) for page in pages)
    for index, block in enumerate(blocks):
        part = spill.parts[index]
        original = block.get("text", block.get("data", block.get("resource", {}).get("text")))
        if part.kind == ITEMS:
            assert part_items(pages, index) == json.loads(original)
        else:
            assert utf8("".join(texts[index])) == utf8(original)


@given(st.text(alphabet="0123456789abcdef", min_size=32, max_size=32), st.integers(min_value=1, max_value=999_999))
def test_spill_uris_round_trip(spill_id: str, page: int) -> None:
    assert parse_spill_uri(spill_uri(spill_id, page)) == SpillRef(spill_id, page)
    assert parse_spill_uri(spill_uri(spill_id)) == SpillRef(spill_id, 1)


@settings(max_examples=500)
@given(st.one_of(st.text(max_size=120), st.text(max_size=60).map(lambda t: "mcp-token-otel://spill/" + t)))
def test_anything_else_is_rejected_or_is_exactly_a_spill_uri(uri: str) -> None:
    try:
        ref = parse_spill_uri(uri)
    except SpillUriError as exc:
        assert exc.reason in ("malformed", "page_out_of_range")
        return
    canonical = spill_uri(ref.spill_id, ref.page)
    assert uri.lower() in (canonical.lower(), spill_uri(ref.spill_id).lower())


def small_spill(tool: str) -> Any:
    return build_spill({"content": [{"type": "text", "text": "x" * 400}]}, 100, tool=tool, tokens=100)


class StoreModel(RuleBasedStateMachine):
    """The store against a model: expiry = last put/read + TTL, LRU drop under the byte cap, owner-only reads."""

    ids = Bundle("ids")

    @initialize()
    def start(self) -> None:
        self.spill = small_spill("t")
        self.capacity = 4
        self.store = MemorySpillStore(ttl=10.0, max_bytes=self.capacity * self.spill.memory, max_tombstones=10_000)
        self.now = 0.0
        self.live: dict[str, tuple[str, float]] = {}  # id -> (owner, expires), least recently used first
        self.gone: dict[str, str] = {}  # id -> owner

    @rule(target=ids, owner=st.sampled_from(["a", "b", "c"]))
    def put(self, owner: str) -> str:
        self._expire()
        stored = self.store.put(owner, self.spill, self.now)
        assert stored.spill_id is not None
        while len(self.live) >= self.capacity:
            old = next(iter(self.live))
            self.gone[old] = self.live.pop(old)[0]
        self.live[stored.spill_id] = (owner, self.now + 10.0)
        return stored.spill_id

    @rule(spill_id=ids, reader=st.sampled_from(["a", "b", "c"]))
    def get(self, spill_id: str, reader: str) -> None:
        self._expire()
        outcome = self.store.get(spill_id, reader, self.now).outcome
        if spill_id in self.live:
            owner, _ = self.live[spill_id]
            if owner == reader:
                assert outcome == SERVED
                del self.live[spill_id]
                self.live[spill_id] = (owner, self.now + 10.0)
            else:
                assert outcome == FORBIDDEN
        else:
            assert outcome == (EXPIRED if self.gone[spill_id] == reader else FORBIDDEN)

    @rule(reader=st.sampled_from(["a", "b"]))
    def unknown(self, reader: str) -> None:
        assert self.store.get("e" * 32, reader, self.now).outcome == NOT_FOUND

    @rule(seconds=st.floats(min_value=0, max_value=8))
    def wait(self, seconds: float) -> None:
        self.now += seconds

    def _expire(self) -> None:
        for spill_id, (owner, expires) in list(self.live.items()):
            if expires <= self.now:
                del self.live[spill_id]
                self.gone[spill_id] = owner

    @invariant()
    def bounded(self) -> None:
        assert self.store.bytes <= self.store.max_bytes and len(self.store) <= self.capacity


TestStoreModel = StoreModel.TestCase
TestStoreModel.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
