"""Reading a spill: the URI grammar, a page answered with its place in the kept result, and every refusal a
JSON-RPC error (-32602, the code the MCP specification gives a resource that is not found) whose data says why,
never another conversation's data."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mcp_token_otel.core.guard.annotate import META_PREFIX
from mcp_token_otel.core.spill import (
    EXPIRED,
    FORBIDDEN,
    INVALID,
    INVALID_PARAMS,
    META_SPILL_KEY,
    NOT_FOUND,
    PREFIX,
    SERVED,
    MemorySpillStore,
    SpillRef,
    SpillUriError,
    build_spill,
    is_spill_uri,
    parse_spill_uri,
    read_spill,
    spill_uri,
)
from tests.helpers.spill_support import source_file

ID = "0123456789abcdef0123456789abcdef"


def test_the_meta_key_is_in_the_projects_namespace() -> None:
    assert META_SPILL_KEY == META_PREFIX + "spill"


@pytest.mark.parametrize(("uri", "ref"), [
    (f"mcp-token-otel://spill/{ID}", SpillRef(ID, 1)),
    (f"mcp-token-otel://spill/{ID}?page=1", SpillRef(ID, 1)),
    (f"mcp-token-otel://spill/{ID}?page=31", SpillRef(ID, 31)),
    (f"MCP-Token-OTEL://SPILL/{ID}?page=2", SpillRef(ID, 2)),  # scheme and host compare without case
    (f"mcp-token-otel://spill/{ID}?page=999999", SpillRef(ID, 999_999)),
])
def test_spill_uris_parse(uri: str, ref: SpillRef) -> None:
    assert is_spill_uri(uri)
    assert parse_spill_uri(uri) == ref
    assert parse_spill_uri(spill_uri(ref.spill_id, ref.page)) == ref


@pytest.mark.parametrize(("uri", "reason"), [
    (f"mcp-token-otel://spill/{ID.upper()}", "malformed"),
    (f"mcp-token-otel://spill/{ID[:-1]}", "malformed"),
    (f"mcp-token-otel://spill/{ID}0", "malformed"),
    (f"mcp-token-otel://spill/{ID}/", "malformed"),
    (f"mcp-token-otel://spill/{ID}?page=", "malformed"),
    (f"mcp-token-otel://spill/{ID}?page=-1", "malformed"),
    (f"mcp-token-otel://spill/{ID}?page=+2", "malformed"),
    (f"mcp-token-otel://spill/{ID}?page=02", "malformed"),
    (f"mcp-token-otel://spill/{ID}?page=2&size=100000", "malformed"),  # no page size chosen by the reader
    (f"mcp-token-otel://spill/{ID}?page_tokens=100000", "malformed"),
    (f"mcp-token-otel://spill/{ID}?page=2#x", "malformed"),
    (f"mcp-token-otel://spill/{ID}?page=%32", "malformed"),
    (f"mcp-token-otel://spill/{ID}?page=0", "page_out_of_range"),
    (f"mcp-token-otel://spill/{ID}?page=1000000", "page_out_of_range"),
    (f"mcp-token-otel://spill/{ID}?page=" + "9" * 5000, "malformed"),  # too long to be a spill URI at all
    (f"mcp-token-otel://spill/{ID}?page=" + "9" * 100, "page_out_of_range"),
    ("mcp-token-otel://spill/", "malformed"),
    ("file:///etc/passwd", "malformed"),
    (None, "malformed"),
    (12, "malformed"),
])
def test_malformed_uris_are_rejected_with_a_reason(uri: Any, reason: str) -> None:
    with pytest.raises(SpillUriError) as info:
        parse_spill_uri(uri)
    assert info.value.reason == reason
    assert len(str(info.value)) < 200  # a 5,000-digit page number is not echoed back


def kept(tokens: int = 20_000, page_tokens: int = 5000) -> tuple[MemorySpillStore, str, str]:
    text = source_file(tokens)
    store = MemorySpillStore(ttl=300, max_bytes=64 << 20)
    spill = build_spill({"content": [{"type": "text", "text": text}]}, page_tokens, tool="read_file")
    spill_id = store.put("session-a", spill, now=0.0).spill_id
    assert spill_id is not None
    return store, spill_id, text


def test_every_page_is_served_to_its_owner_with_its_place_and_the_next_uri() -> None:
    store, spill_id, text = kept()
    uri: str | None = spill_uri(spill_id)  # the bare URI: page 1
    texts = []
    number = 0
    while uri is not None:
        number += 1
        answer = read_spill(store, uri, "session-a", now=float(number))
        assert answer.outcome == SERVED and answer.error is None and answer.result is not None
        assert (answer.page, answer.tool) == (number, "read_file")
        meta = answer.result["_meta"][META_SPILL_KEY]
        assert meta["page"] == number and meta["tokens"] == answer.tokens <= 5000
        (item,) = answer.result["contents"]
        assert item["uri"] == spill_uri(spill_id, number) and item["mimeType"] == "text/plain"
        assert item["_meta"][META_SPILL_KEY]["continues"] == ("next" in meta)
        texts.append(item["text"])
        uri = meta.get("next")
    assert number == meta["pages"] >= 4
    assert "".join(texts).encode() == text.encode()
    assert "resultType" not in answer.result  # only the 2026-07-28 protocol has it


def test_the_2026_07_28_protocol_gets_its_result_fields() -> None:
    store, spill_id, _ = kept(3000)
    result = read_spill(store, spill_uri(spill_id, 1), "session-a", 1.0, protocol_version="2026-07-28").result
    assert result is not None
    assert (result["resultType"], result["cacheScope"], result["ttlMs"]) == ("complete", "private", 0)


def error_of(answer: Any) -> dict[str, Any]:
    assert answer.result is None and answer.error is not None
    assert answer.error["code"] == INVALID_PARAMS
    json.dumps(answer.error)  # plain JSON
    return answer.error


def test_another_conversation_reads_not_found_counted_as_forbidden() -> None:
    store, spill_id, text = kept(3000)
    foreign = read_spill(store, spill_uri(spill_id, 1), "session-b", now=1.0)
    unknown = read_spill(store, spill_uri("f" * 32, 1), "session-b", now=1.0)
    assert (foreign.outcome, unknown.outcome) == (FORBIDDEN, NOT_FOUND)
    assert foreign.tool == "read_file" and unknown.tool is None  # for the operator's counter only
    ef, eu = error_of(foreign), error_of(unknown)
    # The two read the same, apart from the uri each named: existence is not confirmed to another conversation.
    assert ef["message"].replace(spill_id, "ID") == eu["message"].replace("f" * 32, "ID")
    assert ef["data"]["reason"] == eu["data"]["reason"] == NOT_FOUND
    assert text[:50] not in json.dumps(ef)
    # A page out of range of someone else's spill is not found either (its page count is not told).
    beyond = read_spill(store, spill_uri(spill_id, 99), "session-b", now=1.0)
    assert beyond.outcome == FORBIDDEN and "pages" not in error_of(beyond)["data"]
    # A reader without a budget key reads no one's spill.
    assert read_spill(store, spill_uri(spill_id, 1), None, now=1.0).outcome == FORBIDDEN


def test_an_expired_spill_says_expired_to_its_owner() -> None:
    store, spill_id, _ = kept(3000)
    answer = read_spill(store, spill_uri(spill_id, 1), "session-a", now=301.0, ttl=300)
    error = error_of(answer)
    assert answer.outcome == EXPIRED and error["data"] == {"uri": spill_uri(spill_id, 1), "reason": "expired",
                                                           "cause": "ttl"}
    assert "5 minutes pass without a read" in error["message"] and "Call the tool again" in error["message"]
    assert read_spill(store, spill_uri(spill_id, 1), "session-b", now=302.0).outcome == FORBIDDEN


def test_pages_out_of_range_and_malformed_uris_are_invalid_params() -> None:
    store, spill_id, _ = kept(3000, page_tokens=1000)
    pages = store.get(spill_id, "session-a", 0.0).spill.page_count  # type: ignore[union-attr]
    for page in (pages + 1, 0, 10**7):
        answer = read_spill(store, f"{PREFIX}{spill_id}?page={page}", "session-a", now=1.0)
        error = error_of(answer)
        assert answer.outcome == INVALID and error["data"]["reason"] == "page_out_of_range"
        assert error["data"]["pages"] == pages and f"?page={pages:,}" in error["message"]
    for uri in (f"{PREFIX}{spill_id}?page=x", f"{PREFIX}nope", PREFIX + "a" * 10_000):
        answer = read_spill(store, uri, "session-a", now=1.0)
        error = error_of(answer)
        assert answer.outcome == INVALID and error["data"]["reason"] == "malformed"
        assert len(error["data"]["uri"]) <= 96 and len(error["message"]) < 400


def test_a_flood_of_reads_for_unknown_ids_keeps_the_store_unchanged() -> None:
    store, spill_id, _ = kept(3000)
    size, count = store.bytes, len(store)
    for i in range(5000):
        assert read_spill(store, spill_uri(f"{i:032x}", 1), "session-a", now=1.0).outcome == NOT_FOUND
    assert (store.bytes, len(store)) == (size, count)
    assert read_spill(store, spill_uri(spill_id), "session-a", now=2.0).outcome == SERVED


def test_the_resources_capability_is_added_only_where_missing() -> None:
    from mcp_token_otel.core.spill import CAPABILITY_METHODS, empty_listing, with_resources_capability

    assert {"initialize", "server/discover"} == CAPABILITY_METHODS
    result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {"listChanged": True}},
              "serverInfo": {"name": "s", "version": "1"}}
    added, changed = with_resources_capability(result)
    assert changed and added["capabilities"] == {"tools": {"listChanged": True}, "resources": {}}
    assert result["capabilities"] == {"tools": {"listChanged": True}}  # the input is not changed
    declared = {"capabilities": {"resources": {"subscribe": True}}}
    assert with_resources_capability(declared) == (declared, False)
    for odd in (None, [], {"capabilities": None}, {"serverInfo": {}}):
        assert with_resources_capability(odd) == (odd, False)
    assert empty_listing("resources/list") == {"resources": []}
    assert empty_listing("resources/templates/list") == {"resourceTemplates": []}
    assert empty_listing("resources/read") is None and empty_listing("tools/list") is None
