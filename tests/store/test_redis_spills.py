"""Kept results (guard.spill) in the shared budget store's Redis, against a real redis-server: replica A keeps a cut
result, replica B serves every page of it; another conversation is told not_found; the TTL and the byte bound
across replicas (expired, evicted); keys hashed under the prefix; Redis down: kept in this process, counted."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from mcp_token_otel.config import config_from_dict
from mcp_token_otel.core.spill import META_SPILL_KEY, build_spill, parse_spill_uri, spill_to_wire
from mcp_token_otel.recorder import TokenRecorder
from mcp_token_otel.store.redis_spills import RedisSpillStore
from tests.helpers.calls import exchange
from tests.helpers.redis_server import RedisServer
from tests.helpers.spill_support import source_file
from tests.helpers.support import scrape

CALL = {"name": "read_file", "arguments": {"path": "/big.txt"}}


def file_result(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": json.dumps({"content": text})}],
            "structuredContent": {"content": text}}


@pytest.fixture
def replicas(request: pytest.FixtureRequest) -> Iterator[Any]:
    """``replicas(server, n, **guard)``: n recorders (replicas of one server) sharing a Redis budget store."""
    made: list[TokenRecorder] = []
    prefix = f"spill-{request.node.name[:40]}:"

    def make(server: RedisServer, n: int = 2, **guard: Any) -> list[TokenRecorder]:
        config = config_from_dict({
            "budget": {"store": server.url, "store_prefix": prefix, "store_timeout": 5.0},
            "guard": {"mode": "enforce", "max_response_tokens": 2000, "spill": True, "sides": ["server"], **guard},
        })
        out = [TokenRecorder(config, server_name="fs") for _ in range(n)]
        made.extend(out)
        return out

    yield make
    for rec in made:
        rec.close()


def read(rec: TokenRecorder, uri: str, key: str) -> Any:
    return exchange(rec, "server", "resources/read", {"uri": uri}, key, guard=True)[0]


def test_one_replica_keeps_another_serves_every_page(redis_server: RedisServer, replicas: Any) -> None:
    a, b = replicas(redis_server)
    assert isinstance(a.guard.spill_store, RedisSpillStore)
    text = source_file(12_000)
    cut, _ = exchange(a, "server", "tools/call", CALL, "conv-1", result=file_result(text))
    link = cut["content"][-1]
    uri: str | None = link["uri"]
    texts: list[str] = []
    readers = [b, a]
    while uri:
        page = read(readers[len(texts) % 2], uri, "conv-1")  # pages from either replica, in turn
        assert "contents" in page, page
        texts.extend(item["text"] for item in page["contents"])
        uri = page["_meta"][META_SPILL_KEY].get("next")
    assert "".join(texts) == text
    other = read(b, link["uri"], "conv-2")
    assert other["code"] == -32602 and other["data"]["reason"] == "not_found"
    unknown = read(b, "mcp-token-otel://spill/" + "1" * 32, "conv-1")
    assert unknown["data"]["reason"] == "not_found"
    reads = scrape(b).value("mcp_token_spill_reads_total", side="server", server="fs", tool="read_file",
                            outcome="forbidden")
    assert reads == 1
    # The id, the only secret, is no key: keys are its keyed hash under the prefix.
    spill_id = parse_spill_uri(link["uri"]).spill_id
    client = redis.Redis.from_url(redis_server.url)
    keys = [k.decode() for k in client.scan_iter(match="spill-*")]
    assert keys and all(k.startswith("spill-test_one_replica") for k in keys)
    assert not any(spill_id in k for k in keys)


def test_the_ttl_holds_across_replicas(redis_server: RedisServer, replicas: Any) -> None:
    a, b = replicas(redis_server, spill_ttl=1)
    client = redis.Redis.from_url(redis_server.url)
    cut, _ = exchange(a, "server", "tools/call", CALL, "conv-1", result=file_result(source_file(6000)))
    uri = cut["content"][-1]["uri"]
    kept = [k for k in client.scan_iter(match="spill-test_the_ttl*{spill}:s:*") if not k.endswith(b":t")]
    assert len(kept) == 1
    assert "contents" in read(b, uri, "conv-1")  # its TTL starts again: Redis drops it a second later
    deadline = time.monotonic() + 10
    while client.exists(kept[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert read(b, uri, "conv-1")["data"] == {"uri": uri, "reason": "expired", "cause": "ttl"}
    assert read(a, uri, "conv-2")["data"]["reason"] == "not_found"  # and still no one else's


def test_past_the_byte_bound_the_least_recently_read_go_first(redis_server: RedisServer, replicas: Any) -> None:
    text = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(1500))  # ASCII
    spill = build_spill(file_result(text), 2000, tool="read_file")
    document = json.dumps(spill_to_wire(spill), ensure_ascii=False, separators=(",", ":")).encode()
    a, b = replicas(redis_server, spill_max_bytes=int(len(document) * 2.5))  # room for two
    uris = []
    for n, rec in enumerate((a, b, a)):
        cut, _ = exchange(rec, "server", "tools/call", CALL, "conv-1", result=file_result(text))
        uris.append(cut["content"][-1]["uri"])
        if n == 1:
            time.sleep(0.01)  # ranked by Redis's clock, in milliseconds
            assert "contents" in read(a, uris[0], "conv-1")  # the first is read again: the second is older now
    assert read(b, uris[1], "conv-1")["data"] == {"uri": uris[1], "reason": "expired", "cause": "evicted"}
    assert "contents" in read(b, uris[0], "conv-1") and "contents" in read(b, uris[2], "conv-1")
    assert scrape(a).value("mcp_token_spill_evictions_total", side="server", server="fs") == 1


def test_redis_down_keeps_the_result_in_this_process(own_redis: RedisServer, replicas: Any) -> None:
    (a,) = replicas(own_redis, n=1)
    own_redis.stop()
    cut, _ = exchange(a, "server", "tools/call", CALL, "conv-1", result=file_result(source_file(6000)))
    uri = cut["content"][-1]["uri"]
    assert "contents" in read(a, uri, "conv-1")  # this replica still serves it
    assert read(a, uri, "conv-2")["data"]["reason"] == "not_found"
    errors = scrape(a)
    assert errors.value("mcp_token_budget_store_errors_total", op="spill_put") >= 1
