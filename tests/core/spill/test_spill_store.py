"""The spill store: a TTL renewed by reads, a byte cap with the least recently read dropped first, each spill
read only by its owner, expired told apart from never kept, and no state left by reads of unknown ids."""

from __future__ import annotations

import itertools
import threading
import tracemalloc

import pytest

from mcp_token_otel.core.spill import (
    EVICTED,
    EXPIRED,
    FORBIDDEN,
    NO_OWNER,
    NOT_FOUND,
    SERVED,
    TIMED_OUT,
    TOO_LARGE,
    MemorySpillStore,
    Spill,
    build_spill,
    is_spill_id,
    new_spill_id,
)


def spill(chars: int = 1000, tool: str = "read_file") -> Spill:
    return build_spill({"content": [{"type": "text", "text": "x" * chars}]}, 500, tool=tool, tokens=chars // 4)


def test_ids_are_128_random_bits_and_never_repeat() -> None:
    ids = {new_spill_id() for _ in range(2000)}
    assert len(ids) == 2000 and all(is_spill_id(i) and len(i) == 32 for i in ids)


def test_the_owner_reads_and_each_read_renews_the_ttl() -> None:
    store = MemorySpillStore(ttl=300, max_bytes=10 << 20)
    kept = spill()
    stored = store.put("session-a", kept, now=0.0)
    assert stored.spill_id is not None and stored.refused is None and stored.evicted == 0
    got = store.get(stored.spill_id, "session-a", now=299.0)
    assert (got.outcome, got.spill, got.tool) == (SERVED, kept, "read_file")
    assert store.get(stored.spill_id, "session-a", now=598.0).outcome == SERVED  # 299 s after the last read
    gone = store.get(stored.spill_id, "session-a", now=898.0)  # 300 s without a read
    assert (gone.outcome, gone.cause, gone.spill, gone.tool) == (EXPIRED, TIMED_OUT, None, "read_file")
    assert store.get(stored.spill_id, "session-a", now=899.0).outcome == EXPIRED  # and stays expired
    assert len(store) == 0 and store.bytes == 0 and store.expirations == 1


def test_another_owner_is_forbidden_and_does_not_renew_it() -> None:
    store = MemorySpillStore(ttl=100, max_bytes=10 << 20)
    spill_id = store.put("conversation=a", spill(), now=0.0).spill_id
    assert spill_id is not None
    for reader in ("conversation=b", "", None, "conversation=a "):
        found = store.get(spill_id, reader, now=50.0)
        assert (found.outcome, found.spill) == (FORBIDDEN, None)
    assert store.get(spill_id, "conversation=a", now=99.0).outcome == SERVED
    assert store.get(spill_id, "conversation=b", now=250.0).outcome == FORBIDDEN  # expired: still not theirs
    assert store.get(spill_id, "conversation=a", now=250.0).outcome == EXPIRED


def test_unknown_ids_are_not_found_and_leave_nothing_behind() -> None:
    store = MemorySpillStore(ttl=100, max_bytes=10 << 20)
    store.put("a", spill(), now=0.0)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(20_000):
            assert store.get(f"{i:032x}", "a", now=1.0).outcome == NOT_FOUND
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024 and len(store) == 1


def test_the_byte_cap_drops_the_least_recently_read_first() -> None:
    one = spill(10_000)
    store = MemorySpillStore(ttl=1000, max_bytes=3 * one.memory + 100)
    ids = [store.put("a", spill(10_000), now=float(t)).spill_id for t in range(3)]
    assert all(ids) and len(store) == 3
    assert store.get(ids[0], "a", now=5.0).outcome == SERVED  # the first is now the most recently read
    stored = store.put("a", spill(10_000), now=6.0)
    assert stored.evicted == 1 and store.evictions == 1 and len(store) == 3
    dropped = store.get(ids[1], "a", now=7.0)
    assert (dropped.outcome, dropped.cause) == (EXPIRED, EVICTED)
    assert store.get(ids[0], "a", now=7.0).outcome == SERVED and store.get(ids[2], "a", now=7.0).outcome == SERVED
    assert store.bytes <= store.max_bytes


def test_a_spill_above_the_cap_or_without_an_owner_is_refused() -> None:
    store = MemorySpillStore(ttl=10, max_bytes=5000)
    assert store.put("a", spill(100_000), now=0.0).refused == TOO_LARGE
    assert store.put(None, spill(), now=0.0).refused == NO_OWNER
    assert store.put("", spill(), now=0.0).refused == NO_OWNER
    assert len(store) == 0 and store.evictions == 0


def test_tombstones_are_bounded_in_number_and_age() -> None:
    store = MemorySpillStore(ttl=1, max_bytes=10 << 20, max_tombstones=10, tombstone_seconds=100)
    ids = [store.put("a", spill(100), now=0.0).spill_id for _ in range(30)]
    assert all(ids)
    # Expired at 1 s: the ten most recent are remembered as expired, the rest forgotten (not found).
    outcomes = [store.get(i, "a", now=2.0).outcome for i in ids if i]
    assert outcomes.count(EXPIRED) == 10 and outcomes.count(NOT_FOUND) == 20
    assert outcomes[-10:] == [EXPIRED] * 10
    # After tombstone_seconds even those are forgotten.
    assert all(store.get(i, "a", now=200.0).outcome == NOT_FOUND for i in ids if i)


def test_a_colliding_id_factory_never_overwrites_a_spill() -> None:
    fixed = itertools.chain(["a" * 32, "a" * 32, "b" * 32], itertools.repeat("a" * 32))
    store = MemorySpillStore(ttl=10, max_bytes=10 << 20, new_id=lambda: next(fixed))
    assert store.put("x", spill(), now=0.0).spill_id == "a" * 32
    assert store.put("y", spill(), now=0.0).spill_id == "b" * 32
    with pytest.raises(RuntimeError, match="keeps returning ids in use"):
        store.put("z", spill(), now=0.0)
    assert store.get("a" * 32, "x", now=1.0).outcome == SERVED


def test_bad_store_settings_are_rejected() -> None:
    for ttl, max_bytes in ((0, 1), (1, 0), (-1, 5)):
        with pytest.raises(ValueError, match="must be positive"):
            MemorySpillStore(ttl=ttl, max_bytes=max_bytes)


def test_threads_share_one_store_consistently() -> None:
    one = spill(2000)
    store = MemorySpillStore(ttl=1000, max_bytes=20 * one.memory)
    errors: list[str] = []

    def worker(owner: str) -> None:
        mine = []
        for step in range(200):
            stored = store.put(owner, spill(2000), now=float(step))
            if stored.spill_id:
                mine.append(stored.spill_id)
            for spill_id in mine[-3:]:
                outcome = store.get(spill_id, owner, now=float(step)).outcome
                if outcome not in (SERVED, EXPIRED):
                    errors.append(outcome)
                if store.get(spill_id, owner + "-other", now=float(step)).outcome != FORBIDDEN and outcome == SERVED:
                    errors.append("read by another owner")

    threads = [threading.Thread(target=worker, args=(f"owner-{n}",)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert 0 < store.bytes <= store.max_bytes and len(store) <= 20
    assert store.evictions == 4 * 200 - len(store)
