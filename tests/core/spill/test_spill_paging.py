"""Pages of a kept result: text pages concatenate to the original byte for byte, JSON array pages are valid JSON
that together hold the array's items, every page within its budget as measuring the read counts it, and the
cost stays bounded on hostile shapes."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from mcp_token_otel.core.estimation import estimate_tokens
from mcp_token_otel.core.measure import DEFAULT_POLICY, Policy, measure_result
from mcp_token_otel.core.spill import (
    BLOB,
    ITEMS,
    MAX_PAGES,
    META_SPILL_KEY,
    TEXT,
    SpillRefused,
    build_spill,
    fit_text,
    page_result,
    spill_from_wire,
    spill_to_wire,
)
from tests.conftest import chars4
from tests.helpers.spill_support import part_texts, read_all, source_file

C4 = Policy(estimator=chars4, estimator_name="chars/4")


def text_result(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}]}


def page_data_tokens(result: dict[str, Any]) -> int:
    return measure_result("resources/read", result).data_tokens


def test_a_150000_token_file_pages_at_a_5000_token_cap_byte_for_byte() -> None:
    text = source_file(150_000)
    spill = build_spill(text_result(text), 5000, tool="read_file")
    pages = read_all(spill)
    assert len(pages) == spill.page_count
    assert 30 <= spill.page_count <= 33  # ~150,000 tokens in pages of up to 5,000 (each at least 98% full)
    joined = "".join(item["text"] for page in pages for item in page["contents"])
    assert joined.encode("utf-8") == text.encode("utf-8")
    for number, page in enumerate(pages, 1):
        meta = page["_meta"][META_SPILL_KEY]
        assert meta["page"] == number and meta["pages"] == spill.page_count and meta["pageTokens"] == 5000
        # The page's own count, and what measuring the read answer counts as its data, agree and fit the cap.
        assert meta["tokens"] == page_data_tokens(page) <= 5000
        if number < spill.page_count:
            assert meta["tokens"] >= 4800  # pages are filled, not cut short
    assert spill.tokens == measure_result("tools/call", text_result(text)).data_tokens
    assert spill.size == len(text.encode("utf-8"))


def test_text_pages_end_at_line_ends_and_carry_their_byte_offsets() -> None:
    text = source_file(20_000)
    spill = build_spill(text_result(text), 2000)
    offset = 0
    for page in read_all(spill):
        (item,) = page["contents"]
        meta = item["_meta"][META_SPILL_KEY]
        size = len(item["text"].encode("utf-8"))
        assert meta["bytes"] == [offset, offset + size]
        offset += size
        if meta["continues"]:
            assert item["text"].endswith("\n")  # source code: a line end is always near
    assert offset == len(text.encode("utf-8"))


def test_a_file_wrapped_in_json_pages_the_file_itself() -> None:
    # The filesystem-shaped server: the text block is {"content": file} as JSON, structuredContent the same.
    text = source_file(30_000)
    result = {"content": [{"type": "text", "text": json.dumps({"content": text})}],
              "structuredContent": {"content": text}}
    spill = build_spill(result, 5000)
    assert len(spill.parts) == 1  # structuredContent repeats the text block: kept once
    part = spill.parts[0]
    assert (part.kind, part.pointer, part.mime) == (TEXT, "/content", "text/plain")
    assert "".join(part_texts(read_all(spill))[0]) == text
    # The npm server's shape: the file as the text, structuredContent {"content": file}.
    spill = build_spill({"content": [{"type": "text", "text": text}], "structuredContent": {"content": text}}, 5000)
    assert len(spill.parts) == 1 and spill.parts[0].pointer == ""


def test_a_json_array_pages_by_whole_items() -> None:
    items = [{"id": i, "name": f"item {i}", "tags": ["a", "b"][: i % 3], "score": i / 7} for i in range(3000)]
    text = json.dumps(items, indent=2)
    spill = build_spill(text_result(text), 3000)
    (part,) = spill.parts
    assert part.kind == ITEMS and part.summary is not None
    assert (part.summary.count, part.summary.keys, part.summary.objects) == (3000, ("id", "name", "tags", "score"),
                                                                             True)
    got: list[Any] = []
    for page in read_all(spill):
        (item,) = page["contents"]
        meta = item["_meta"][META_SPILL_KEY]
        value = json.loads(item["text"])  # every page is valid JSON on its own
        assert meta["items"] == [len(got), len(got) + len(value), 3000]
        got.extend(value)
        assert page_data_tokens(page) <= 3000
        # The items are the original's bytes: the page is "[" + a slice of the original + "]".
        assert item["text"][1:-1] in text
    assert got == items


def test_an_item_larger_than_a_page_is_cut_as_text_and_the_next_starts_a_page() -> None:
    big = "x " * 20_000
    items = [{"a": 1}, {"big": big}, {"b": 2}, {"c": 3}]
    text = json.dumps(items)
    spill = build_spill(text_result(text), 1000)
    pieces = [item for page in read_all(spill) for item in page["contents"]]
    metas = [p["_meta"][META_SPILL_KEY] for p in pieces]
    assert metas[0]["items"] == [0, 1, 4] and json.loads(pieces[0]["text"]) == [{"a": 1}]
    cut = [p for p, m in zip(pieces, metas, strict=True) if m.get("item") == 1]
    assert len(cut) > 3 and all(p["mimeType"] == "text/plain" for p in cut)
    assert json.loads("".join(p["text"] for p in cut)) == {"big": big}  # the item's text, whole
    assert metas[-1]["items"] == [2, 4, 4] and json.loads(pieces[-1]["text"]) == [{"b": 2}, {"c": 3}]
    for page in read_all(spill):
        assert page_data_tokens(page) <= 1000


def test_structured_content_of_its_own_and_an_mcpserver_list() -> None:
    rows = [{"k": i, "v": "w" * 30} for i in range(500)]
    # MCPServer's list output: each item a text block, structuredContent {"result": [...]} (not a duplicate).
    result = {"content": [{"type": "text", "text": json.dumps(r)} for r in rows[:3]],
              "structuredContent": {"result": rows}}
    spill = build_spill(result, 800)
    structured = spill.parts[-1]
    assert (structured.source, structured.kind, structured.pointer) == ("structuredContent", ITEMS, "/result")
    texts = part_texts(read_all(spill))
    assert [json.loads(t) for t in texts[0] + texts[1] + texts[2]] == rows[:3]  # small parts share page 1
    assert [row for t in texts[len(spill.parts) - 1] for row in json.loads(t)] == rows


def test_parts_pack_onto_pages_and_a_part_that_does_not_fit_starts_a_new_one() -> None:
    blocks = [{"type": "text", "text": f"block {i} " * 5} for i in range(10)]
    blocks.append({"type": "text", "text": "long line\n" * 600})
    spill = build_spill({"content": blocks}, 400, policy=C4)
    first = spill.pages[0]
    assert [p.part for p in first] == list(range(10))  # ten small blocks on one page
    assert all(p.part == 10 for page in spill.pages[1:] for p in page)  # the long one starts page 2
    assert "".join(part_texts(read_all(spill))[10]) == "long line\n" * 600


def test_media_blobs_and_other_blocks_are_kept() -> None:
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 300).decode()
    link = {"type": "resource_link", "uri": "file:///a.txt", "name": "a"}
    result = {"content": [{"type": "text", "text": "see the image"}, {"type": "image", "data": png,
                                                                       "mimeType": "image/png"},
                          {"type": "resource", "resource": {"uri": "file:///b", "blob": png}},
                          {"type": "resource", "resource": {"uri": "file:///c.md", "mimeType": "text/markdown",
                                                            "text": "# title\n"}}, link]}
    spill = build_spill(result, 500)
    kinds = [(p.kind, p.mime) for p in spill.parts]
    assert kinds == [(TEXT, "text/plain"), (BLOB, "image/png"), (BLOB, "application/octet-stream"),
                     (TEXT, "text/markdown"), (TEXT, "application/json")]
    contents = [item for page in read_all(spill) for item in page["contents"]]
    assert contents[1]["blob"] == png and contents[1]["mimeType"] == "image/png" and "text" not in contents[1]
    assert json.loads(contents[4]["text"]) == link
    assert spill.size == len("see the image") + 2 * 308 + len("# title\n") + len(contents[4]["text"])


def test_a_blob_larger_than_a_page_has_a_page_of_its_own() -> None:
    data = base64.b64encode(bytes(range(256)) * 40).decode()
    spill = build_spill({"content": [{"type": "text", "text": "a"}, {"type": "audio", "data": data,
                                                                     "mimeType": "audio/wav"}]}, 100)
    assert [[p.part for p in page] for page in spill.pages] == [[0], [1]]
    assert spill.page_tokens_of(2) == estimate_tokens(data) > 100  # the one page above the budget: it cannot be cut


def test_fit_text_never_splits_what_belongs_together() -> None:
    for joiner in ("\r\n", "e\u0301", "\U0001f468\u200d\U0001f469", "\ud83d\ude00", "a\ufe0f"):
        text = ("w" * 37 + joiner) * 200
        start = 0
        while start < len(text):
            end, tokens = fit_text(text, start, len(text), 7, chars4, 4.0)
            assert end > start and tokens == chars4(text[start:end])
            if end < len(text):
                assert tokens <= 7
                before, after = text[end - 1], text[end]
                assert before + after not in ("\r\n", "\ud83d\ude00") and after not in "\u0301\u200d\ufe0f"
                assert before != "\u200d"
            start = end


def test_a_budget_below_one_character_still_makes_progress() -> None:
    text = "\U0001f600" * 10
    spill = build_spill(text_result(text), 1, policy=Policy(estimator=lambda t: 3 * len(t)))
    assert spill.page_count == 10 and "".join(part_texts(read_all(spill))[0]) == text


def test_empty_texts_and_arrays_are_kept_as_such() -> None:
    spill = build_spill({"content": [{"type": "text", "text": ""}, {"type": "text", "text": "[]"},
                                     {"type": "text", "text": " [ ] "}]}, 100)
    texts = part_texts(read_all(spill))
    assert texts == {0: [""], 1: ["[]"], 2: ["[]"]}
    assert spill.parts[2].summary is not None and spill.parts[2].summary.count == 0


@pytest.mark.parametrize("text", [
    "[1, 2, NaN]",  # not strict JSON: paged as text
    "[1, 2,]", "[1 2]", "[1, 2}", "[INFO] a log line, not JSON\n" * 50, '{"a": 1, "a": [1, 2, 3]}',
    "[" * 5000 + "]" * 5000,  # deeper than the parser goes
])
def test_anything_that_is_not_a_clean_array_is_paged_as_text(text: str) -> None:
    spill = build_spill(text_result(text), 50)
    assert spill.parts[0].kind == TEXT
    assert "".join(part_texts(read_all(spill))[0]) == text


def test_duplicate_keys_stop_the_unwrapping() -> None:
    text = '{"content": "first", "content": "second"}'  # json.loads keeps one key; the text has two members
    spill = build_spill(text_result(text), 50)
    assert spill.parts[0].pointer == "" and spill.parts[0].text == text


def test_hostile_shapes_page_in_bounded_work() -> None:
    calls = 0

    def counting(text: str) -> int:
        nonlocal calls
        calls += 1
        return estimate_tokens(text)

    policy = Policy(estimator=counting)
    tiny = json.dumps(list(range(100_000)))  # 100,000 tiny items
    spill = build_spill(text_result(tiny), 5000, policy=policy, tokens=1)
    assert spill.parts[0].kind == ITEMS
    assert sum(len(json.loads(t)) for t in part_texts(read_all(spill))[0]) == 100_000
    assert calls <= 12 * spill.page_count + 20  # a few probes per page, not one per item
    calls = 0
    huge = "0123456789abcdef" * 655_360  # one 10 MB string
    spill = build_spill(text_result(huge), 5000, policy=policy, tokens=1)
    assert "".join(part_texts(read_all(spill))[0]) == huge
    assert calls <= 12 * spill.page_count + 20
    deep = {"d": None}
    for _ in range(3000):
        deep = {"d": [deep]}
    # Too deep for the JSON writer: left out (and said so), the rest kept.
    spill = build_spill({"content": [{"type": "text", "text": "t"}], "structuredContent": deep}, 5000)
    assert spill.omitted == ("structuredContent",) and [p.source for p in spill.parts] == ["content[0]"]


def test_too_many_pages_too_large_and_empty_are_refused() -> None:
    with pytest.raises(SpillRefused) as info:
        build_spill(text_result("word " * (MAX_PAGES + 10)), 1, policy=C4)
    assert info.value.reason == "too_many_pages"
    with pytest.raises(SpillRefused) as info:
        build_spill(text_result("x" * 100_000), 1000, max_bytes=50_000)
    assert info.value.reason == "too_large"
    with pytest.raises(SpillRefused) as info:
        build_spill({"content": []}, 1000)
    assert info.value.reason == "empty"
    with pytest.raises(ValueError, match="page_tokens must be positive"):
        build_spill(text_result("x"), 0)


def test_memory_counts_the_texts_as_python_holds_them() -> None:
    ascii_text = "x" * 100_000
    wide = ascii_text[:-1] + "\U0001f600"  # one astral character: four bytes per character in memory
    assert build_spill(text_result(wide), 5000).memory >= 400_000 > build_spill(text_result(ascii_text), 5000).memory


def test_a_spill_survives_its_wire_form() -> None:
    result = {"content": [{"type": "text", "text": json.dumps([{"a": i} for i in range(300)])},
                          {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
                          {"type": "text", "text": source_file(3000)}]}
    spill = build_spill(result, 500, tool="t")
    again = spill_from_wire(json.loads(json.dumps(spill_to_wire(spill))))
    assert again == spill
    assert [page_result(again, "0" * 32, n) for n in range(1, 4)] == [page_result(spill, "0" * 32, n)
                                                                       for n in range(1, 4)]
    for bad in (None, {"v": 2}, {**spill_to_wire(spill), "pages": [[[0, 0, 10**9, 0, 0, 0, -1, -1]]]},
                {**spill_to_wire(spill), "parts": [{"kind": "video"}]}, {**spill_to_wire(spill), "tokens": "1"}):
        with pytest.raises(ValueError, match="spill document"):
            spill_from_wire(bad)


def test_the_default_policy_is_the_projects_estimator() -> None:
    assert DEFAULT_POLICY.estimator is estimate_tokens
