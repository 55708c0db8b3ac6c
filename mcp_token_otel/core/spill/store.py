"""Where spills are kept: in memory, bounded in time (a TTL renewed by each read) and in bytes (least recently
used dropped first), each owned by the budget key that produced it.

A read names an id and the reader's budget key. The answer is one of:

* ``served``: the spill (its TTL starts again);
* ``expired``: the reader's own spill, gone (its TTL passed, or it was dropped to make room: ``cause``);
* ``forbidden``: the id is live or recently gone but belongs to another key. The reader is told "not found"
  (see :mod:`.read`): saying "not yours" would confirm that the id exists to someone who should never have had
  it; the operator's metrics still count it apart;
* ``not_found``: never kept here (or forgotten: tombstones are bounded).

Owners are kept as SHA-256 digests of their keys (fixed size, no session id held in clear). A read of an
unknown id adds nothing to the store, so a flood of them costs lookups, not memory. The store takes a lock
around every operation; spills are built (and paged) before ``put``, outside it.

A store shared by several processes (the deployment's budget store) implements the same two calls
(:class:`SpillStore`) and keeps :meth:`Spill.to_wire <.wire.spill_to_wire>` documents.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

from .paging import Spill
from .uri import IdFactory, new_spill_id

SERVED = "served"
EXPIRED = "expired"
NOT_FOUND = "not_found"
FORBIDDEN = "forbidden"
#: Every outcome of a read, as the reads counter labels it (``invalid``: a malformed URI or a page out of range).
READ_OUTCOMES: tuple[str, ...] = (SERVED, EXPIRED, NOT_FOUND, FORBIDDEN, "invalid")
#: Why a spill was gone before its owner read it again.
TIMED_OUT = "ttl"
EVICTED = "evicted"
#: Why a result was not kept.
NO_OWNER = "no_owner"
TOO_LARGE = "too_large"

#: Ids remembered after their spill is gone, to answer "expired" rather than "not found", and for how long.
DEFAULT_TOMBSTONES = 4096
DEFAULT_TOMBSTONE_SECONDS = 3600.0


@dataclass(frozen=True, slots=True)
class Lookup:
    outcome: str
    spill: Spill | None = None
    #: The tool whose result it was (for labels), when the id is known.
    tool: str | None = None
    #: For ``expired``: TIMED_OUT or EVICTED.
    cause: str | None = None


@dataclass(frozen=True, slots=True)
class Stored:
    """The answer to a put: the new id, or why the result was not kept; ``evicted``: spills dropped to make room."""

    spill_id: str | None
    refused: str | None = None
    evicted: int = 0


class SpillStore(Protocol):
    def put(self, owner: str | None, spill: Spill, now: float) -> Stored: ...
    def get(self, spill_id: str, owner: str | None, now: float) -> Lookup: ...


def owner_digest(owner: str) -> bytes:
    return hashlib.sha256(owner.encode("utf-8", "surrogatepass")).digest()


@dataclass(slots=True)
class _Entry:
    spill: Spill
    owner: bytes
    expires: float


@dataclass(frozen=True, slots=True)
class _Tombstone:
    owner: bytes
    tool: str | None
    cause: str
    at: float


class MemorySpillStore:
    """Spills of one process. ``ttl``: seconds a spill stays after it is kept or last read; ``max_bytes``: the
    memory all spills may hold together (:attr:`Spill.memory`); a single spill above it is refused."""

    def __init__(
        self,
        ttl: float,
        max_bytes: int,
        *,
        max_tombstones: int = DEFAULT_TOMBSTONES,
        tombstone_seconds: float = DEFAULT_TOMBSTONE_SECONDS,
        new_id: IdFactory = new_spill_id,
    ) -> None:
        if ttl <= 0 or max_bytes <= 0:
            raise ValueError(f"ttl and max_bytes must be positive, got {ttl} and {max_bytes}")
        self.ttl = ttl
        self.max_bytes = max_bytes
        self._max_tombstones = max_tombstones
        self._tombstone_seconds = tombstone_seconds
        self._new_id = new_id
        # Least recently used first; since every spill has the same TTL, also soonest to expire first.
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._tombstones: OrderedDict[str, _Tombstone] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        #: Spills dropped to make room for newer ones, and spills whose TTL passed (since the store was made).
        self.evictions = 0
        self.expirations = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        """Memory held by the live spills."""
        return self._bytes

    def put(self, owner: str | None, spill: Spill, now: float) -> Stored:
        if not owner:
            return Stored(None, NO_OWNER)
        if spill.memory > self.max_bytes:
            return Stored(None, TOO_LARGE)
        digest = owner_digest(owner)
        with self._lock:
            self._sweep(now)
            evicted = 0
            while self._entries and self._bytes + spill.memory > self.max_bytes:
                spill_id, entry = self._entries.popitem(last=False)
                self._bury(spill_id, entry, EVICTED, now)
                evicted += 1
            self.evictions += evicted
            spill_id = self._new_id()
            for _ in range(8):  # 128 random bits: a collision is not expected, but never overwrite one
                if spill_id not in self._entries and spill_id not in self._tombstones:
                    break
                spill_id = self._new_id()
            else:
                raise RuntimeError("the spill id factory keeps returning ids in use")
            self._entries[spill_id] = _Entry(spill, digest, now + self.ttl)
            self._bytes += spill.memory
        return Stored(spill_id, None, evicted)

    def get(self, spill_id: str, owner: str | None, now: float) -> Lookup:
        digest = owner_digest(owner) if owner else b""
        with self._lock:
            self._sweep(now)
            entry = self._entries.get(spill_id)
            if entry is not None:
                if not hmac.compare_digest(entry.owner, digest):
                    return Lookup(FORBIDDEN, tool=entry.spill.tool)  # and its life is not extended
                if entry.expires <= now:
                    del self._entries[spill_id]
                    self._bury(spill_id, entry, TIMED_OUT, now)
                    self.expirations += 1
                    return Lookup(EXPIRED, tool=entry.spill.tool, cause=TIMED_OUT)
                entry.expires = now + self.ttl
                self._entries.move_to_end(spill_id)
                return Lookup(SERVED, entry.spill, entry.spill.tool)
            tomb = self._tombstones.get(spill_id)
            if tomb is None:
                return Lookup(NOT_FOUND)
            if not hmac.compare_digest(tomb.owner, digest):
                return Lookup(FORBIDDEN, tool=tomb.tool)
            return Lookup(EXPIRED, tool=tomb.tool, cause=tomb.cause)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._tombstones.clear()
            self._bytes = 0

    def _bury(self, spill_id: str, entry: _Entry, cause: str, now: float) -> None:
        self._bytes -= entry.spill.memory
        self._tombstones[spill_id] = _Tombstone(entry.owner, entry.spill.tool, cause, now)
        while len(self._tombstones) > self._max_tombstones:
            self._tombstones.popitem(last=False)

    def _sweep(self, now: float) -> None:
        """Expire spills whose TTL passed and forget old tombstones (both in order, so O(1) amortised)."""
        while self._entries:
            spill_id, entry = next(iter(self._entries.items()))
            if entry.expires > now:
                break
            del self._entries[spill_id]
            self._bury(spill_id, entry, TIMED_OUT, now)
            self.expirations += 1
        horizon = now - self._tombstone_seconds
        while self._tombstones:
            spill_id, tomb = next(iter(self._tombstones.items()))
            if tomb.at > horizon:
                break
            del self._tombstones[spill_id]
