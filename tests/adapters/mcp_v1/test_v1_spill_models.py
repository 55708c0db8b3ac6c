"""The spill's wire shapes as the mcp 1.x SDK reads them: a cut result with its resource link (the custom
scheme as a pydantic AnyUrl) and each page of a kept result, ``_meta`` kept."""

from __future__ import annotations

import json

from mcp import types

from mcp_token_otel.core.spill import (
    META_SPILL_KEY,
    MemorySpillStore,
    build_spill,
    link_block,
    read_spill,
    spill_uri,
    with_spill,
)
from tests.helpers.spill_support import source_file


def test_the_cut_result_and_every_page_validate() -> None:
    rows = [{"id": i, "text": "w" * 20} for i in range(400)]
    result = {"content": [{"type": "text", "text": source_file(8000)}, {"type": "text", "text": json.dumps(rows)}]}
    spill = build_spill(result, 2000, tool="read_file")
    store = MemorySpillStore(ttl=300, max_bytes=1 << 26)
    spill_id = store.put("session", spill, 0.0).spill_id
    assert spill_id is not None
    cut = {"content": [{"type": "text", "text": "shown"}, {"type": "text", "text": "notice"}]}
    final = types.CallToolResult.model_validate(with_spill(cut, "[notice]", link_block(spill, spill_id)))
    link = final.content[-1]
    assert isinstance(link, types.ResourceLink) and str(link.uri) == spill_uri(spill_id)
    assert link.meta is not None and link.meta[META_SPILL_KEY]["tokens"] == spill.tokens
    uri: str | None = spill_uri(spill_id)
    pages = 0
    while uri:
        answer = read_spill(store, uri, "session", 1.0, protocol_version="2025-06-18")
        assert answer.result is not None
        page = types.ReadResourceResult.model_validate(answer.result)
        dumped = page.model_dump(by_alias=True, mode="json", exclude_none=True)
        assert dumped["_meta"] == answer.result["_meta"] and dumped["contents"] == answer.result["contents"]
        uri = answer.result["_meta"][META_SPILL_KEY].get("next")
        pages += 1
    assert pages == spill.page_count >= 3
