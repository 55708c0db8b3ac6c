"""The spill's wire shapes as the mcp 2.x SDK reads them, for every protocol version it speaks: a cut result with
its notice and resource link, each page of a kept result, and a refused read as a JSON-RPC error."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mcp_types import jsonrpc
from mcp_types.methods import parse_server_result, serialize_server_result
from mcp_types.version import KNOWN_PROTOCOL_VERSIONS

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


def kept() -> tuple[MemorySpillStore, str, dict[str, Any]]:
    rows = [{"id": i, "text": "w" * 20} for i in range(400)]
    result = {"content": [{"type": "text", "text": source_file(8000)}, {"type": "text", "text": json.dumps(rows)},
                          {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}]}
    spill = build_spill(result, 2000, tool="read_file")
    store = MemorySpillStore(ttl=300, max_bytes=1 << 26)
    spill_id = store.put("session", spill, 0.0).spill_id
    assert spill_id is not None
    cut = {"content": [{"type": "text", "text": "shown"}, {"type": "text", "text": "notice"}]}
    return store, spill_id, with_spill(cut, "\n\n[mcp-token-otel: the notice]", link_block(spill, spill_id))


@pytest.mark.parametrize("version", KNOWN_PROTOCOL_VERSIONS)
def test_the_cut_result_and_every_page_validate(version: str) -> None:
    store, spill_id, final = kept()
    if version >= "2026-07-28":
        final = {**final, "resultType": "complete"}
    parsed = parse_server_result("tools/call", version, final)
    link = parsed.content[-1]
    assert link.type == "resource_link" and str(link.uri) == spill_uri(spill_id)
    assert link.size and link.mime_type == "multipart/mixed" and link.meta[META_SPILL_KEY]["pages"] >= 3
    uri: str | None = spill_uri(spill_id)
    pages = 0
    while uri:
        answer = read_spill(store, uri, "session", 1.0, protocol_version=version)
        assert answer.result is not None
        dumped = serialize_server_result("resources/read", version, answer.result)
        assert dumped["_meta"][META_SPILL_KEY] == answer.result["_meta"][META_SPILL_KEY]  # kept through the SDK
        assert [c.get("_meta") for c in dumped["contents"]] == [c["_meta"] for c in answer.result["contents"]]
        parse_server_result("resources/read", version, answer.result)
        uri = answer.result["_meta"][META_SPILL_KEY].get("next")
        pages += 1
    assert pages >= 3


def test_a_refused_read_is_a_jsonrpc_error_the_sdk_reads() -> None:
    store, spill_id, _ = kept()
    refused = ((spill_uri(spill_id, 1), "other"), (spill_uri(spill_id, 999), "session"),
               ("mcp-token-otel://spill/x", "session"))
    for uri, owner in refused:
        answer = read_spill(store, uri, owner, 1.0)
        assert answer.error is not None
        error = jsonrpc.JSONRPCError.model_validate({"jsonrpc": "2.0", "id": 7, "error": answer.error})
        assert error.error.code == jsonrpc.INVALID_PARAMS and error.error.data["uri"]
