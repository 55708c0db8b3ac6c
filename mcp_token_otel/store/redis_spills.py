"""Spills kept in the shared budget store's Redis: any replica serves a read of a result another one cut.

Each spill is one hash (its owner's keyed digest, its tool, its document: :func:`~..core.spill.spill_to_wire` as
JSON) that lives ``guard.spill_ttl`` after it was kept or last read by its owner (PEXPIRE), and a tombstone that
outlives it by an hour (owner, tool, why it went), so a late read is told ``expired`` rather than ``not_found``, and
another conversation's read is told neither. Keys are the spill id's keyed hash under ``budget.store_prefix`` (the
id, the only secret, is never a key), all under one hash tag so the scripts that touch several stay in one slot of
a cluster.

``guard.spill_max_bytes`` bounds the documents of every replica together: a sorted set ranks the spills by last
read, and a put that would pass the bound drops the least recently read first (their tombstones say ``evicted``),
in the same atomic script. Redis's own ``maxmemory`` is the operator's: leave room for the spills beside the
budgets.

Faults never reach the call: a put the store does not take (unreachable, slow, backing off) is kept in this
process instead (a read must then reach this replica); a read looks here first, then in Redis, and one Redis cannot
answer is told ``not_found``. Each is counted through the budget store's error callback (op ``spill_put``,
``spill_get``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core.spill import (
    EVICTED,
    EXPIRED,
    FORBIDDEN,
    NO_OWNER,
    NOT_FOUND,
    SERVED,
    TIMED_OUT,
    TOO_LARGE,
    Lookup,
    MemorySpillStore,
    Spill,
    Stored,
    new_spill_id,
    spill_from_wire,
    spill_to_wire,
)
from ..core.spill.store import DEFAULT_TOMBSTONE_SECONDS
from .base import KeyHasher
from .connection import FAILURES

if TYPE_CHECKING:
    from .local import Health

#: How long a tombstone outlives its spill (as the memory store keeps them).
TOMBSTONE_MS = round(DEFAULT_TOMBSTONE_SECONDS * 1000)
#: Spills past their TTL swept from the ranking per put, at most (each put sweeps a few: bounded work).
_SWEEP = 64
#: Spills dropped to make room for one put, at most (a put needing more is refused: too large for the bound now).
_EVICT = 1000

#: KEYS: the ranking (zset: member -> last read, ms), the sizes (hash: member -> bytes, and ``_total``), the spill,
#: its tombstone. ARGV: document, owner digest, tool ('' none), size, ttl_ms, tomb_ms, max_bytes, member, the prefix
#: of a member's spill key, how many expired to sweep, how many to evict at most. Returns {1, evicted} when kept,
#: {0, evicted} when it did not fit.
PUT = """
local rank, sizes, key, tomb = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local size, ttl, tomb_ms, max = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local base = ARGV[9]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local total = tonumber(redis.call('HGET', sizes, '_total') or '0')
for _, member in ipairs(redis.call('ZRANGEBYSCORE', rank, '-inf', now - ttl, 'LIMIT', 0, tonumber(ARGV[10]))) do
  total = total - tonumber(redis.call('HGET', sizes, member) or '0')
  redis.call('HDEL', sizes, member)
  redis.call('ZREM', rank, member)
end
local evicted = 0
while total + size > max and evicted < tonumber(ARGV[11]) do
  local oldest = redis.call('ZPOPMIN', rank)
  if #oldest == 0 then break end
  local member = oldest[1]
  total = total - tonumber(redis.call('HGET', sizes, member) or '0')
  redis.call('HDEL', sizes, member)
  if redis.call('DEL', base .. member) == 1 then
    evicted = evicted + 1
    local gone = base .. member .. ':t'
    if redis.call('EXISTS', gone) == 1 then redis.call('HSET', gone, 'cause', 'evicted') end
  end
end
if total < 0 then total = 0 end
if total + size > max then
  redis.call('HSET', sizes, '_total', total)
  return {0, evicted}
end
redis.call('HSET', key, 'doc', ARGV[1], 'owner', ARGV[2], 'tool', ARGV[3])
redis.call('PEXPIRE', key, ttl)
redis.call('HSET', tomb, 'owner', ARGV[2], 'tool', ARGV[3], 'cause', 'ttl')
redis.call('PEXPIRE', tomb, ttl + tomb_ms)
redis.call('ZADD', rank, now, ARGV[8])
redis.call('HSET', sizes, ARGV[8], size)
redis.call('HSET', sizes, '_total', total + size)
return {1, evicted}
"""

#: KEYS: the spill, its tombstone, the ranking. ARGV: owner digest, ttl_ms, tomb_ms, member. Returns {outcome, tool,
#: document or cause}: outcome 1 served (its TTL starts again), 2 expired, 3 forbidden, 0 not found.
GET = """
local key, tomb, rank = KEYS[1], KEYS[2], KEYS[3]
local f = redis.call('HMGET', key, 'owner', 'tool', 'doc')
if f[1] then
  if f[1] ~= ARGV[1] then return {3, f[2], ''} end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('PEXPIRE', key, ARGV[2])
  redis.call('PEXPIRE', tomb, tonumber(ARGV[2]) + tonumber(ARGV[3]))
  redis.call('ZADD', rank, 'XX', now, ARGV[4])
  return {1, f[2], f[3]}
end
local g = redis.call('HMGET', tomb, 'owner', 'tool', 'cause')
if not g[1] then return {0, '', ''} end
if g[1] ~= ARGV[1] then return {3, g[2], ''} end
return {2, g[2], g[3] or 'ttl'}
"""

_OUTCOMES = {0: NOT_FOUND, 1: SERVED, 2: EXPIRED, 3: FORBIDDEN}


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value or "")


class RedisSpillStore:
    """The :class:`~..core.spill.SpillStore` of a deployment whose budget store is Redis (made by
    :meth:`RedisStore.spill_store <.redis_store.RedisStore.spill_store>`: its client, health and key hashing)."""

    def __init__(self, client: Any, health: Callable[[], Health], hasher: KeyHasher, prefix: str,
                 ttl: float, max_bytes: int) -> None:
        """``client``: the budget store's ``redis.Redis``; ``health``: its health as it is now (a forked child gets
        its own)."""
        if ttl <= 0 or max_bytes <= 0:
            raise ValueError(f"ttl and max_bytes must be positive, got {ttl} and {max_bytes}")
        self.ttl = ttl
        self.max_bytes = max_bytes
        self._health_of = health
        self._hash = hasher
        self._put = client.register_script(PUT)
        self._get = client.register_script(GET)
        tag = f"{prefix}{{spill}}:"
        self._base = tag + "s:"
        self._rank = tag + "rank"
        self._sizes = tag + "sizes"
        self._ttl_ms = max(1, round(ttl * 1000))
        #: Spills kept in this process while Redis did not take them.
        self.local = MemorySpillStore(ttl, max_bytes)

    def _member(self, spill_id: str) -> str:
        return self._hash("spill", spill_id)

    def _owner(self, owner: str) -> str:
        return self._hash("spill-owner", owner)

    def put(self, owner: str | None, spill: Spill, now: float) -> Stored:
        if not owner:
            return Stored(None, NO_OWNER)
        doc = json.dumps(spill_to_wire(spill), ensure_ascii=False, separators=(",", ":")).encode("utf-8",
                                                                                                 "surrogatepass")
        if len(doc) > self.max_bytes:
            return Stored(None, TOO_LARGE)
        if not self._health_of().try_store():
            self._health_of().failed("spill_put", None)
            return self.local.put(owner, spill, now)
        spill_id = new_spill_id()
        member = self._member(spill_id)
        try:
            kept, evicted = self._put(
                [self._rank, self._sizes, self._base + member, self._base + member + ":t"],
                [doc, self._owner(owner), spill.tool or "", len(doc), self._ttl_ms, TOMBSTONE_MS, self.max_bytes,
                 member, self._base, _SWEEP, _EVICT],
            )
        except FAILURES as exc:
            self._health_of().failed("spill_put", exc)
            return self.local.put(owner, spill, now)
        self._health_of().ok()
        if not int(kept):
            return Stored(None, TOO_LARGE, int(evicted))
        return Stored(spill_id, None, int(evicted))

    def get(self, spill_id: str, owner: str | None, now: float) -> Lookup:
        if len(self.local):
            found = self.local.get(spill_id, owner, now)
            if found.outcome != NOT_FOUND:
                return found
        if not self._health_of().try_store():
            self._health_of().failed("spill_get", None)
            return Lookup(NOT_FOUND)
        member = self._member(spill_id)
        try:
            code, tool, value = self._get(
                [self._base + member, self._base + member + ":t", self._rank],
                [self._owner(owner) if owner else "", self._ttl_ms, TOMBSTONE_MS, member],
            )
        except FAILURES as exc:
            self._health_of().failed("spill_get", exc)
            return Lookup(NOT_FOUND)
        self._health_of().ok()
        outcome = _OUTCOMES.get(int(code), NOT_FOUND)
        name = _text(tool) or None
        if outcome == SERVED:
            return Lookup(SERVED, spill_from_wire(json.loads(value)), name)
        if outcome == EXPIRED:
            return Lookup(EXPIRED, tool=name, cause=EVICTED if _text(value) == EVICTED else TIMED_OUT)
        if outcome == FORBIDDEN:
            return Lookup(FORBIDDEN, tool=name)
        return Lookup(NOT_FOUND)
