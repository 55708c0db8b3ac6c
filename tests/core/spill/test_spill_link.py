"""A cut result that was kept: the response cap's cut, the notice saying in one sentence how to read the rest
(where the text shown ends, the URI, the page size), a JSON summary first, and one resource link after it. The
whole path in the pure core: the cap, the spill, the store, the reads."""

from __future__ import annotations

import json
from typing import Any

from mcp_token_otel.core.estimation import estimate_tokens
from mcp_token_otel.core.guard import GuardSettings, cap_result, notices
from mcp_token_otel.core.guard.engine import _is_notice
from mcp_token_otel.core.guard.pagination import Pagination
from mcp_token_otel.core.measure import DEFAULT_POLICY, measure_result
from mcp_token_otel.core.spill import (
    EXPIRED,
    META_SPILL_KEY,
    NOT_FOUND,
    SERVED,
    MemorySpillStore,
    Spill,
    build_spill,
    is_spill_link,
    link_block,
    read_spill,
    resume_page,
    spill_uri,
    summaries,
    with_spill,
)
from tests.helpers.spill_support import source_file

SETTINGS = GuardSettings(mode="enforce", max_response_tokens=5000, spill=True)
READ_FILE = {"name": "read_file", "inputSchema": {"type": "object", "properties": {
    "path": {"type": "string"}, "head": {"type": "number"}, "tail": {"type": "number"}}}}


def cut_and_keep(result: dict[str, Any], store: MemorySpillStore, owner: str, tool: str = "read_file",
                 now: float = 0.0) -> tuple[dict[str, Any], Spill, str]:
    """What the guard will do: cut at the cap, keep the whole result, rewrite the notice's hint, add the link."""
    cap = SETTINGS.max_response_tokens
    m = measure_result("tools/call", result, tool_name=tool)
    cut, report = cap_result(result, cap, policy=DEFAULT_POLICY, measurement=m, tool=tool,
                             pagination=Pagination.from_tool(READ_FILE))
    assert cut is not None
    spill = build_spill(result, SETTINGS.spill_page_size(cap), tokens=m.data_tokens, tool=tool)
    spill_id = store.put(owner, spill, now).spill_id
    assert spill_id is not None
    hint = notices.spill_hint(spill_uri(spill_id), resume=resume_page(spill, result, cut), pages=spill.page_count,
                              page_tokens=spill.page_tokens, tokens=spill.tokens, ttl=store.ttl,
                              summaries=summaries(spill), omitted=spill.omitted)
    final = with_spill(cut, notices.truncated(report, tool, hint), link_block(spill, spill_id))
    return final, spill, spill_id


def read_every_page(store: MemorySpillStore, spill_id: str, owner: str, now: float) -> list[dict[str, Any]]:
    pages = []
    uri: str | None = spill_uri(spill_id, 1)
    while uri:
        answer = read_spill(store, uri, owner, now)
        assert answer.outcome == SERVED and answer.result is not None
        pages.append(answer.result)
        uri = answer.result["_meta"][META_SPILL_KEY].get("next")
    return pages


def test_a_150000_token_file_cut_at_5000_tokens_is_read_back_whole() -> None:
    text = source_file(150_000)
    # The filesystem-shaped test server: the file as {"content": file}, in the text block and structuredContent.
    result = {"content": [{"type": "text", "text": json.dumps({"content": text})}],
              "structuredContent": {"content": text}}
    store = MemorySpillStore(ttl=SETTINGS.spill_ttl, max_bytes=SETTINGS.spill_max_bytes)
    final, spill, spill_id = cut_and_keep(result, store, "session-a")

    *shown, notice, link = final["content"]
    # The link: the kept result's URI, a name, its media type, its size in bytes and its tokens in _meta.
    assert is_spill_link(link) and link["type"] == "resource_link" and link["uri"] == spill_uri(spill_id)
    assert (link["name"], link["mimeType"], link["size"]) == ("read_file result", "text/plain", len(text.encode()))
    assert link["_meta"][META_SPILL_KEY] == {"tokens": spill.tokens, "pages": spill.page_count, "pageTokens": 5000}
    assert estimate_tokens(text) >= 150_000 and spill.tokens == measure_result("tools/call", result).data_tokens
    # The notice: still the guards' notice (a guard downstream recognises it), one sentence on how to read on.
    assert _is_notice(notice) and notice["text"].startswith("\n\n[mcp-token-otel: response truncated")
    resume = resume_page(spill, result, final)
    assert resume == 2  # the 5,000 tokens shown end on page 2 of pages of 5,000 (the cap counts the JSON escapes)
    assert (f"read on with resources/read of {spill_uri(spill_id)}?page=2 (where the text shown ends) to "
            f"?page={spill.page_count}, pages of up to 5,000 tokens") in notice["text"]
    assert "until 5 minutes pass without a read" in notice["text"]
    assert "Call read_file with" not in notice["text"]  # the tool's own pagination hint gave way to the link
    # The cut still fits the cap: the text shown, plus the notice and the link, which are the guard's.
    m = measure_result("tools/call", final, tool_name="read_file")
    extra = sum(b.data_tokens for b in m.blocks[len(shown):len(shown) + 2])
    assert m.data_tokens - extra <= 5000

    pages = read_every_page(store, spill_id, "session-a", now=10.0)
    assert len(pages) == spill.page_count
    assert "".join(i["text"] for p in pages for i in p["contents"]).encode("utf-8") == text.encode("utf-8")
    assert all(measure_result("resources/read", p).data_tokens <= 5000 for p in pages)
    # What was shown ends inside the page the notice names.
    shown_text = json.loads(shown[0]["text"])["content"]
    before = "".join(i["text"] for p in pages[: resume - 1] for i in p["contents"])
    assert len(before) <= len(shown_text) < len(before) + len(pages[resume - 1]["contents"][0]["text"])

    other = read_spill(store, spill_uri(spill_id, 1), "session-b", now=11.0)
    assert other.outcome == "forbidden" and other.error is not None and other.error["data"]["reason"] == NOT_FOUND
    assert read_spill(store, spill_uri(spill_id, 1), "session-a", now=10.0 + 301).outcome == EXPIRED


def test_a_json_array_result_keeps_its_summary_first() -> None:
    rows = [{"id": i, "path": f"/srv/data/{i:05d}.csv", "size": i * 17, "owner": "svc"} for i in range(4000)]
    result = {"content": [{"type": "text", "text": json.dumps(rows)}]}
    store = MemorySpillStore(ttl=90, max_bytes=1 << 26)
    final, spill, spill_id = cut_and_keep(result, store, "session-a", tool="list_files")
    notice = final["content"][-2]["text"]
    assert "content[0] is a JSON array of 4,000 items, objects with keys id, path, size, owner." in notice
    assert "until 90 seconds pass without a read" in notice and _is_notice(final["content"][-2])
    kept_rows = json.loads(final["content"][0]["text"])
    resume = resume_page(spill, result, final)
    items = [row for p in read_every_page(store, spill_id, "session-a", 1.0) for i in p["contents"]
             for row in json.loads(i["text"])]
    assert items == rows
    # The page named holds the first row not shown.
    page = read_spill(store, spill_uri(spill_id, resume), "session-a", 2.0).result
    assert page is not None
    first, end, total = page["contents"][0]["_meta"][META_SPILL_KEY]["items"]
    assert first <= len(kept_rows) < end and total == 4000


def test_resume_is_page_one_when_the_cut_cannot_be_traced_and_the_hint_for_one_page() -> None:
    text = source_file(6000)
    result = {"content": [{"type": "text", "text": text}]}
    spill = build_spill(result, 5000)
    assert resume_page(spill, result, {"content": [{"type": "text", "text": "something else"}]}) == 1
    assert resume_page(spill, result, {"content": []}) == 1
    assert resume_page(spill, result, result) == 1  # nothing was cut
    hint = notices.spill_hint(spill_uri("a" * 32), resume=1, pages=1, page_tokens=5000, tokens=4000, ttl=300)
    assert f"read it with resources/read of {spill_uri('a' * 32)}?page=1 (one page)" in hint


def test_with_spill_replaces_the_notice_and_appends_one_link() -> None:
    cut = {"content": [{"type": "text", "text": "shown"}, {"type": "text", "text": "old notice"}], "isError": False}
    link = {"type": "resource_link", "uri": spill_uri("b" * 32), "name": "t result"}
    out = with_spill(cut, "new notice", link)
    assert out["content"] == [{"type": "text", "text": "shown"}, {"type": "text", "text": "new notice"}, link]
    assert out["isError"] is False and cut["content"][1]["text"] == "old notice"  # the input is not changed
    assert not is_spill_link({"type": "resource_link", "uri": "file:///x"}) and not is_spill_link("x")


def test_summaries_are_short_whatever_the_keys() -> None:
    hostile = [{("k" * 500 + str(n)) if n % 2 else f"line\n{n}": n for n in range(40)} for _ in range(3)]
    result = {"content": [{"type": "text", "text": json.dumps(hostile)}],
              "structuredContent": {"a": 1, "b": [1, 2], "c\u202e": "x"}}
    spill = build_spill(result, 100)
    found = summaries(spill)
    assert [s.shape for s in found] == ["array", "object"]
    sentences = [notices.json_summary(s) for s in found]
    assert all("\n" not in s and len(s) < 400 for s in sentences)
    assert "and more" in sentences[0] and sentences[1] == "structuredContent is a JSON object of 3 keys: a, b, c?."
    hint = notices.spill_hint(spill_uri("c" * 32), resume=3, pages=9, page_tokens=100, tokens=800, ttl=300,
                              summaries=found, omitted=("structuredContent",))
    assert len(hint) < 1000 and hint.endswith("Not kept: structuredContent (not writable as JSON).")


def test_the_link_names_mixed_parts_and_long_tool_names() -> None:
    result = {"content": [{"type": "text", "text": "a"}, {"type": "image", "data": "iVBORw0KGgo=",
                                                          "mimeType": "image/png"}]}
    link = link_block(build_spill(result, 100, tool="t" * 300), "d" * 32)
    assert link["mimeType"] == "multipart/mixed" and len(link["name"]) <= 72
    assert measure_result("tools/call", {"content": [link]}).data_tokens < 40  # the link costs little context
