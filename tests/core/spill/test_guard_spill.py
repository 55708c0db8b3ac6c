"""The spill in the guard engine: a result the response cap cuts is kept whole and its link follows the notice;
on, off, observe, a tool's opt-out, no owner, too large; a guard downstream never cuts the cut result again; reads
by page, by another owner, after the TTL (the engine's clock), malformed; the resources capability."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mcp_token_otel.core.guard import GuardEngine, GuardSettings, ToolGuard
from mcp_token_otel.core.guard.engine import _is_notice
from mcp_token_otel.core.measure import measure_result
from mcp_token_otel.core.spill import META_SPILL_KEY, MemorySpillStore, is_spill_link, parse_spill_uri
from tests.helpers.spill_support import source_file


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def engine(clock: Clock | None = None, **guard: Any) -> GuardEngine:
    settings = GuardSettings(**{"mode": "enforce", "max_response_tokens": 2000, "spill": True, **guard})
    return GuardEngine(settings, clock=clock or Clock())


def file_result(text: str) -> dict[str, Any]:
    """What a filesystem server's read_file answers: the file in a JSON text block and in structuredContent."""
    return {"content": [{"type": "text", "text": json.dumps({"content": text})}],
            "structuredContent": {"content": text}}


def cut(e: GuardEngine, result: dict[str, Any], owner: str | None = "conv-a", tool: str = "read_file",
        **kwargs: Any) -> Any:
    return e.on_result("tools/call", result, tool=tool, owner=owner, **kwargs)


def read_all(e: GuardEngine, uri: str, owner: str) -> tuple[str, list[dict[str, Any]]]:
    """Every page from ``uri`` on, following each page's next: the joined text and the pages' _meta."""
    texts: list[str] = []
    metas: list[dict[str, Any]] = []
    next_uri: str | None = uri
    while next_uri is not None:
        answer = e.read_spill(next_uri, owner)
        assert answer is not None and answer.result is not None, answer
        metas.append(answer.result["_meta"][META_SPILL_KEY])
        texts.extend(item["text"] for item in answer.result["contents"])
        next_uri = metas[-1].get("next")
        assert len(metas) <= 1000
    return "".join(texts), metas


def test_a_cut_result_is_kept_and_its_pages_give_back_the_file_byte_for_byte() -> None:
    text = source_file(20_000)
    e = engine()
    outcome = cut(e, file_result(text))
    content = outcome.result["content"]
    link, notice = content[-1], content[-2]
    assert is_spill_link(link) and link["mimeType"] == "text/plain"
    assert link["size"] == len(text.encode()) and link["name"] == "read_file result"
    meta = link["_meta"][META_SPILL_KEY]
    assert meta["tokens"] > 15_000 and meta["pageTokens"] == 2000 and meta["pages"] >= 9
    # The notice is the guards' one notice (a guard downstream recognises it), and says how to read the rest.
    assert _is_notice(notice)
    assert link["uri"] in notice["text"] and "pages of up to 2,000 tokens" in notice["text"]
    assert [a.action for a in outcome.actions] == ["truncated", "spilled"]
    assert outcome.spill is not None and outcome.spill.refused is None and outcome.spill.pages == meta["pages"]
    # The cut result is within the cap, the link and notice aside.
    assert measure_result("tools/call", outcome.result).data_tokens < 2000 + 400
    joined, metas = read_all(e, link["uri"], "conv-a")
    assert joined.encode() == text.encode()
    assert [m["page"] for m in metas] == list(range(1, meta["pages"] + 1))
    assert all(m["tokens"] <= 2000 and m["pages"] == meta["pages"] for m in metas)


def test_a_json_array_keeps_its_summary_and_pages_at_item_boundaries() -> None:
    rows = [{"id": i, "name": f"row {i}", "tags": ["a", "b"]} for i in range(3000)]
    e = engine()
    outcome = cut(e, {"content": [{"type": "text", "text": json.dumps(rows)}]}, tool="search")
    notice = outcome.result["content"][-2]["text"]
    assert "a JSON array of 3,000 items, objects with keys id, name, tags" in notice
    uri: str | None = outcome.result["content"][-1]["uri"]
    items: list[Any] = []
    while uri:
        answer = e.read_spill(uri, "conv-a")
        assert answer is not None and answer.result is not None
        for piece in answer.result["contents"]:
            items.extend(json.loads(piece["text"]))  # each page is valid JSON
        uri = answer.result["_meta"][META_SPILL_KEY].get("next")
    assert items == rows


def test_off_observe_and_a_tool_that_opts_out_keep_nothing() -> None:
    result = file_result(source_file(8000))
    off = GuardEngine(GuardSettings(mode="enforce", max_response_tokens=2000))
    assert off.spill_store is None
    assert not any(is_spill_link(b) for b in cut(off, result).result["content"])
    # Observe mode cuts nothing, so keeps nothing: the store is there for the tool that enforces.
    observe = engine(mode="observe", tools={"read_file": ToolGuard(mode="enforce")})
    seen = cut(observe, result, tool="search")
    assert seen.result is result and seen.spill is None and len(observe.spill_store) == 0  # type: ignore[arg-type]
    assert is_spill_link(cut(observe, result).result["content"][-1])
    opted_out = engine(tools={"read_file": ToolGuard(spill=False)})
    kept = cut(opted_out, result)
    assert not any(is_spill_link(b) for b in kept.result["content"]) and kept.spill is None
    assert "truncated" in kept.result["content"][-1]["text"]
    # A side that does not answer reads (the client's) keeps nothing either.
    client = engine()
    assert cut(client, result, spill=False).spill is None and len(client.spill_store) == 0  # type: ignore[arg-type]


def test_no_owner_and_too_large_deliver_the_plain_cut_and_say_why() -> None:
    result = file_result(source_file(8000))
    plain = cut(GuardEngine(GuardSettings(mode="enforce", max_response_tokens=2000)), result).result
    unowned = cut(engine(), result, owner=None)
    assert unowned.result == plain and unowned.spill is not None and unowned.spill.refused == "no_owner"
    assert [a.action for a in unowned.actions] == ["truncated"]
    small = engine(spill_max_bytes=10_000)
    large = cut(small, result)
    assert large.result == plain and large.spill is not None and large.spill.refused == "too_large"
    assert len(small.spill_store) == 0  # type: ignore[arg-type]


def test_a_guard_downstream_never_cuts_the_cut_result_again() -> None:
    server, client = engine(), engine()
    first = cut(server, file_result(source_file(8000))).result
    again = cut(client, first)
    assert again.result is first and not again.actions and again.spill is None
    # A session warning after the link is still a guard's note: a third guard does not count it either.
    noted = {**first, "content": [*first["content"], {"type": "text",
                                                       "text": "\n\n[mcp-token-otel: this session has used 1 of 2]"}]}
    assert cut(engine(), noted).result is noted


def test_reads_by_another_owner_after_the_ttl_and_malformed_ones() -> None:
    clock = Clock()
    e = engine(clock, spill_ttl=60)
    uri = cut(e, file_result(source_file(8000))).result["content"][-1]["uri"]
    other = e.read_spill(uri, "conv-b")
    assert other is not None and other.outcome == "forbidden" and other.error is not None
    assert other.error["code"] == -32602 and other.error["data"]["reason"] == "not_found"  # never "not yours"
    for bad in ("mcp-token-otel://spill/xyz", uri + "?page=0", uri + "&x=1", "mcp-token-otel://spill/" + "a" * 300):
        answer = e.read_spill(bad, "conv-a")
        assert answer is not None and answer.outcome == "invalid" and answer.error is not None
        assert answer.error["code"] == -32602 and answer.error["data"]["reason"] in ("malformed",
                                                                                      "page_out_of_range")
    past = e.read_spill(uri + "?page=999999", "conv-a")
    assert past is not None and past.error is not None and past.error["data"]["reason"] == "page_out_of_range"
    clock.now += 59  # each read by its owner starts the TTL again
    assert e.read_spill(uri, "conv-a").outcome == "served"  # type: ignore[union-attr]
    clock.now += 61
    gone = e.read_spill(uri, "conv-a")
    assert gone is not None and gone.outcome == "expired" and gone.error is not None
    assert gone.error["data"] == {"uri": uri, "reason": "expired", "cause": "ttl"}
    unknown = e.read_spill("mcp-token-otel://spill/" + "f" * 32, "conv-a")
    assert unknown is not None and unknown.outcome == "not_found"


def test_a_flood_of_reads_for_unknown_ids_keeps_nothing() -> None:
    e = engine()
    cut(e, file_result(source_file(8000)))
    store = e.spill_store
    assert isinstance(store, MemorySpillStore) and len(store) == 1
    held = store.bytes
    for n in range(5000):
        answer = e.read_spill(f"mcp-token-otel://spill/{n:032x}?page=1", "conv-a")
        assert answer is not None and answer.outcome == "not_found"
    assert len(store) == 1 and store.bytes == held


def test_the_ids_are_fresh_and_unguessable() -> None:
    e = engine()
    result = file_result(source_file(4000))
    ids = {parse_spill_uri(cut(e, result).result["content"][-1]["uri"]).spill_id for _ in range(20)}
    assert len(ids) == 20 and all(len(i) == 32 for i in ids)


@pytest.mark.parametrize("method", ["initialize", "server/discover"])
def test_the_resources_capability_is_added_only_where_it_lacks(method: str) -> None:
    e = engine()
    bare = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "s"}}
    added = e.on_result(method, bare)
    assert added.capability and added.result["capabilities"] == {"tools": {}, "resources": {}}
    declared = {**bare, "capabilities": {"resources": {"subscribe": True}}}
    kept = e.on_result(method, declared)
    assert kept.result is declared and not kept.capability
    assert e.on_result(method, bare, spill=False).result is bare
    assert engine(spill=False).on_result(method, bare).result is bare


class BrokenStore:
    """A store that fails on every put (a bug, an exhausted resource)."""

    def put(self, owner: str | None, spill: Any, now: float) -> Any:
        raise RuntimeError("the store broke")

    def get(self, spill_id: str, owner: str | None, now: float) -> Any:
        raise RuntimeError("the store broke")


def test_a_fault_while_keeping_delivers_the_plain_cut() -> None:
    result = file_result(source_file(8000))
    plain = cut(GuardEngine(GuardSettings(mode="enforce", max_response_tokens=2000)), result).result
    broken = GuardEngine(GuardSettings(mode="enforce", max_response_tokens=2000, spill=True),
                         spill_store=BrokenStore())
    outcome = cut(broken, result)
    assert outcome.result == plain and outcome.spill is not None and outcome.spill.refused == "fault"
    assert [a.action for a in outcome.actions] == ["truncated"]
