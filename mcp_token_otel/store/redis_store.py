"""Budgets shared through Redis: every replica of a server or proxy counts a conversation in one place.

One add (a call's request and answer tokens, together) is one EVALSHA of the ``ADD`` script (scripts.py): the
increment, the transitions it claims, the repeat and tools/list checks and the budget's expiry in one atomic round
trip.

Faults never reach the caller: an operation past ``budget.store_timeout``, a refused connection, a restarted
Redis (its scripts are loaded again) are answered from this process's count (``source="local"``), counted through
``on_error(op)`` and logged once per outage; the store is tried again after a back-off, not at every message.
What was counted meanwhile is sent when it answers again: with the budget's next add, or by the store's own thread.

Sessions are counted once: the replica whose add created a budget in Redis owns it (``SharedAnswer.owner``);
only the owner lists it in :meth:`RedisStore.sessions` and reports its end with the final figures, read from
Redis when the budget has been idle everywhere. An owner that stops first takes that end figure with it.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis

from ..config import BudgetConfig, mask_url_password
from ..core.budget import BUDGET_STATES, BudgetState
from ..core.guard.limits import RateLimiter
from . import scripts
from .base import BudgetEnd, EndCallback, ErrorCallback, KeyHasher, SharedAnswer
from .connection import FAILURES, connection_pool
from .local import Entry, Health, log

if TYPE_CHECKING:
    from .redis_spills import RedisSpillStore

#: Seconds between tries of an unreachable store.
_BACKOFF_S = 1.0
#: At most this many budgets are sent or checked per pass of the store's thread (one pipelined round trip).
_BATCH = 256
#: How long a budget's keys outlive its idle timeout, so its owner can still read its final figures.
_MAX_GRACE_S = 300.0


def _pool_full(exc: BaseException) -> bool:
    """The pool had no free connection within its deadline: the store is busy, not down."""
    return isinstance(exc, redis.exceptions.ConnectionError) and "Too many connections" in str(exc)


class RedisStore:
    """Budgets counted in Redis (``budget.store: redis://...``), shared by every process that names it."""

    shared = True

    def __init__(
        self,
        budget: BudgetConfig,
        *,
        repeat_window: float = 60.0,
        on_end: EndCallback | None = None,
        on_error: ErrorCallback | None = None,
        backoff: float = _BACKOFF_S,
        sides: Sequence[str] = ("client", "server", "proxy"),
    ) -> None:
        self._pool = connection_pool(budget)
        self._redis = redis.Redis(connection_pool=self._pool)
        self._add_script = self._redis.register_script(scripts.ADD)
        self._peek_script = self._redis.register_script(scripts.PEEK)
        self._rate_script = self._redis.register_script(scripts.RATE)
        self._hash = KeyHasher(budget.store_prefix, budget.store_key_secret)
        self._prefix = budget.store_prefix
        self._window = budget.context_window
        self._warn_at = budget.warning_ratio * budget.context_window
        self._exhaust_at = budget.exhaustion_ratio * budget.context_window
        self._idle = budget.idle_timeout
        idle_ms = max(1, round(budget.idle_timeout * 1000))
        self._idle_ms = str(idle_ms)
        self._ttl_ms = str(idle_ms + round(min(budget.idle_timeout, _MAX_GRACE_S) * 1000))
        self._warn_arg, self._exhaust_arg = repr(self._warn_at), repr(self._exhaust_at)
        self._repeat_window = repeat_window
        self._repeat_ms = str(round(repeat_window * 1000))
        self._max_sessions = budget.max_sessions
        self._tick_s = min(1.0, budget.idle_timeout / 4)
        self._on_end = on_end
        self._sides = tuple(sides)
        self._health_args = (mask_url_password(budget.store), backoff, on_error, _pool_full)
        self._started(fresh=True)
        ref = weakref.ref(self)

        def forked() -> None:
            store = ref()
            if store is not None:
                store._started(fresh=False)

        os.register_at_fork(after_in_child=forked)

    def _started(self, fresh: bool) -> None:
        """(Re)set what belongs to one process: a child of a fork is another replica with its own id and table."""
        #: This process's id in the store (a budget's owner is named by it).
        self.instance = uuid.uuid4().hex
        self._lock = threading.Lock()
        self.health = Health(*self._health_args)
        self._tables: dict[str, OrderedDict[str, Entry]] = {side: OrderedDict() for side in self._sides}
        #: Budgets with tokens counted during an outage, to send when the store answers again.
        self._pending: dict[tuple[str, str], Entry] = {}
        self._orphans: list[tuple[str, str, list[int]]] = []
        self._limiters: dict[tuple[str, float, int], RateLimiter] = {}
        self._seq = itertools.count()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._faulted = False
        if not fresh:
            self._pool.reset()

    def spill_store(self, ttl: float, max_bytes: int) -> RedisSpillStore:
        """Where cut results are kept (``guard.spill``) in this store's Redis: its connections, health and key
        hashing, so any replica serves a read."""
        from .redis_spills import RedisSpillStore

        return RedisSpillStore(self._redis, lambda: self.health, self._hash, self._prefix, ttl, max_bytes)

    # ------------------------------------------------------------------ keys

    def _key(self, hid: str) -> str:
        return f"{self._prefix}{{{hid}}}:b"

    def _repeat_keys(self, hid: str, digests: list[bytes]) -> list[str]:
        return [f"{self._prefix}{{{hid}}}:r:{self._hash('r:' + hid, d.hex())}" for d in digests]

    def _entry(self, side: str, key: str, now: float) -> Entry:
        """The budget's entry, made at its first message; the least recently used past budget.max_sessions ends
        (``evicted``). Under the lock."""
        table = self._tables[side]
        entry = table.get(key)
        if entry is None:
            entry = table[key] = Entry(self._hash(side, key), now)
            while len(table) > self._max_sessions:
                old_key, old = next(iter(table.items()))
                self._let_go(side, old_key, old, "evicted")
        else:
            table.move_to_end(key)
        entry.last_seen = now
        return entry

    # ------------------------------------------------------------------ adds

    def add(
        self,
        side: str,
        key: str,
        tokens: int,
        *,
        call_digest: bytes | None = None,
        tools_digest: bytes | None = None,
    ) -> SharedAnswer:
        try:
            return self._add(side, key, tokens, call_digest, tools_digest)
        except Exception as exc:  # a fault past the handled ones (ours, or the client's): the call still goes on
            self._fault("add", exc)
            return SharedAnswer(0, 0.0, "ok", owner=False, source="local", context_window=self._window)

    def _fault(self, op: str, exc: Exception) -> None:
        if not self._faulted:
            self._faulted = True
            log.warning("budget store: unexpected %s in %s; answered locally", type(exc).__name__, op, exc_info=exc)
        self.health.busy(op)

    def _add(
        self, side: str, key: str, tokens: int, call_digest: bytes | None, tools_digest: bytes | None
    ) -> SharedAnswer:
        if tokens.__class__ is not int or tokens < 0:
            tokens = max(0, int(tokens))
        if self._thread is None:
            self._start_thread()
        with self._lock:
            entry = self._entry(side, key, time.monotonic())
        if not self.health.try_store():
            return self._local(side, key, entry, tokens, [], None, call_digest, tools_digest, None)
        with self._lock:  # what was counted during an outage goes first, in this round trip
            increments, entry.unsent = [*entry.unsent, tokens], []
            deferred, entry.tools_unsent = entry.tools_unsent, None
            self._pending.pop((side, key), None)
        try:
            reply = self._add_script(
                [self._key(entry.hid), *self._repeat_keys(entry.hid, [call_digest] if call_digest else [])],
                self._add_args(increments, tools_digest if tools_digest is not None else deferred,
                               tools_digest is not None),
            )
        except FAILURES as exc:
            return self._local(side, key, entry, tokens, increments[:-1], deferred, call_digest, tools_digest, exc)
        self.health.ok()
        with self._lock:
            return entry.take_reply(reply, len(increments), True, self._window)

    def _add_args(self, increments: list[int], tools: bytes | None, report: bool, release: bool = False) -> list[Any]:
        return [self._idle_ms, self._ttl_ms, self._warn_arg, self._exhaust_arg, self.instance, self._repeat_ms,
                tools if tools is not None else b"", "1" if report else "0", "1" if release else "0", *increments]

    def _local(
        self,
        side: str,
        key: str,
        entry: Entry,
        tokens: int,
        unsent: list[int],
        deferred: bytes | None,
        call_digest: bytes | None,
        tools_digest: bytes | None,
        exc: BaseException | None,
    ) -> SharedAnswer:
        """Answer an add from this process's count (the store failed with ``exc``, or is backing off: None).
        ``unsent`` and ``deferred``: what an add that failed took from the entry, put back unless it was sent."""
        delivered = isinstance(exc, redis.exceptions.TimeoutError)  # sent, maybe applied: never sent twice
        with self._lock:
            if not delivered:
                entry.unsent[:0] = unsent
                if entry.tools_unsent is None:
                    entry.tools_unsent = deferred
            entered = entry.count_locally(tokens, self._warn_at, self._exhaust_at, send_later=not delivered)
            if entry.unsent:
                self._pending[side, key] = entry
            repeat, changed = entry.check_locally(call_digest, tools_digest, self._repeat_window)
            answer = entry.answer(self._window, "local", entered, repeat, changed)
        self.health.failed("add", exc)
        return answer

    # ------------------------------------------------------------------ reads for the guards

    def peek(self, side: str, key: str) -> SharedAnswer:
        try:
            return self._peek(side, key)
        except Exception as exc:
            self._fault("peek", exc)
            return SharedAnswer(0, 0.0, "ok", owner=False, source="local", context_window=self._window)

    def _peek(self, side: str, key: str) -> SharedAnswer:
        if self._thread is None:
            self._start_thread()
        with self._lock:
            entry = self._tables[side].get(key)
            if entry is not None and entry.state == 2 and entry.shared and not entry.fired & 2:
                # exhausted, as the store said: it stays so until the budget ends (no round trip)
                return SharedAnswer(entry.tokens, entry.tokens / self._window, "exhausted", owner=entry.owner,
                                    source="shared", calls=entry.calls, context_window=self._window)
            hid = entry.hid if entry is not None else self._hash(side, key)
        if not self.health.try_store():
            return self._peek_locally(entry, None)
        try:
            reply = self._peek_script([self._key(hid)], [self.instance])
        except FAILURES as exc:
            return self._peek_locally(entry, exc)
        self.health.ok()
        exists, tokens, state, count, age_ms, mine = (int(v) for v in reply)
        with self._lock:
            pending = sum(entry.unsent) if entry is not None else 0  # counted here, not sent yet
            if not exists or age_ms > int(self._idle_ms):  # ended: its next message starts afresh
                return SharedAnswer(pending, pending / self._window, "ok", owner=False, source="shared",
                                    context_window=self._window)
            if entry is not None:
                entry.tokens, entry.state, entry.calls, entry.owner, entry.shared = (
                    tokens + pending, max(entry.state, state), count, bool(mine), True)
        return SharedAnswer(tokens + pending, (tokens + pending) / self._window, BUDGET_STATES[state],
                            owner=bool(mine), source="shared", calls=count, context_window=self._window)

    def _peek_locally(self, entry: Entry | None, exc: BaseException | None) -> SharedAnswer:
        self.health.failed("peek", exc)
        if entry is None:
            return SharedAnswer(0, 0.0, "ok", owner=False, source="local", context_window=self._window)
        with self._lock:
            return SharedAnswer(entry.tokens, entry.tokens / self._window, entry.state_name, owner=entry.owner,
                                source="local", calls=entry.calls, context_window=self._window)

    def rate(self, side: str, key: str, window_s: float, limit: int, *, record_over: bool = False) -> int:
        try:
            return self._rate(side, key, window_s, limit, record_over)
        except Exception as exc:
            self._fault("rate", exc)
            return 1

    def _rate(self, side: str, key: str, window_s: float, limit: int, record_over: bool) -> int:
        if self.health.try_store():
            with self._lock:  # any side names a window (the guards' is not a budget's side)
                table = self._tables.get(side)
                entry = table.get(key) if table is not None else None
            hid = entry.hid if entry is not None else self._hash(side, key)
            try:
                count = self._rate_script(
                    [f"{self._prefix}{{{hid}}}:q"],
                    [str(max(1, round(window_s * 1_000_000))), str(limit), "1" if record_over else "0",
                     f"{self.instance}:{next(self._seq)}"],
                )
            except FAILURES as exc:
                self.health.failed("rate", exc)
            else:
                self.health.ok()
                return int(count)
        else:
            self.health.failed("rate", None)
        limiter = self._limiters.get((side, window_s, limit))
        if limiter is None:
            with self._lock:
                limiter = self._limiters.setdefault(
                    (side, window_s, limit), RateLimiter(limit, window_s, max_keys=self._max_sessions))
        return limiter.hit(key, record_over=record_over)[1]

    # ------------------------------------------------------------------ ends

    def end(self, side: str, key: str) -> None:
        """The budget's connection ended here: what this process counted during an outage is sent, its owner
        reports the end with the shared figures and gives up ownership (the next replica to add to it counts it
        from then on)."""
        try:
            self._end(side, key)
        except Exception as exc:
            self._fault("end", exc)

    def _end(self, side: str, key: str) -> None:
        with self._lock:
            entry = self._tables[side].pop(key, None)
            self._pending.pop((side, key), None)
        if entry is None:
            return
        source = "shared" if entry.shared else "local"
        if (entry.owner or entry.unsent) and not self.health.try_store():
            source = "local"
            self._orphan(side, key, entry.unsent)  # sent by the store's thread once Redis answers
        elif entry.owner or entry.unsent:
            try:
                reply = self._add_script(
                    [self._key(entry.hid)],
                    self._add_args(entry.unsent, entry.tools_unsent, False, release=entry.owner),
                )
            except FAILURES as exc:
                self.health.failed("end", exc)
                source = "local"
                if not isinstance(exc, redis.exceptions.TimeoutError):
                    self._orphan(side, key, entry.unsent)
            else:
                self.health.ok()
                sent, entry.unsent = len(entry.unsent), []
                with self._lock:
                    entry.take_reply(reply, sent, False, self._window)
        with self._lock:
            self._report_end(side, key, entry, "ended", source)

    def _orphan(self, side: str, key: str, unsent: list[int]) -> None:
        """Tokens of a budget this process let go of, still to send (by the store's thread)."""
        if unsent:
            with self._lock:
                if len(self._orphans) < _BATCH:
                    self._orphans.append((side, key, unsent))

    def _let_go(self, side: str, key: str, entry: Entry, why: str) -> None:
        """Under the lock: this process stops keeping the budget (``why``: evicted, idle); tokens it counted but
        has not sent still go to the store (by the store's thread)."""
        del self._tables[side][key]
        self._pending.pop((side, key), None)
        if entry.unsent and len(self._orphans) < _BATCH:
            self._orphans.append((side, key, entry.unsent))
        self._report_end(side, key, entry, why)

    def _report_end(self, side: str, key: str, entry: Entry, why: str, source: Any = None) -> None:
        """Under the lock, as the memory store's ends are."""
        if self._on_end is None:
            return
        end = BudgetEnd(entry.tokens, entry.tokens / self._window, entry.state_name, why, entry.owner,
                        source or ("shared" if entry.shared else "local"))
        try:
            self._on_end(side, key, end)
        except Exception:
            log.debug("budget store end callback failed", exc_info=True)

    def expire(self) -> None:
        """One pass of the store's own thread, now: tokens counted during an outage are sent once the store
        answers, budgets idle here are ended (an owned one only once Redis says it is idle everywhere, with its
        final figures)."""
        try:
            self._tick(time.monotonic())
        except Exception:  # never raises: the next pass tries again
            log.debug("budget store pass failed", exc_info=True)

    def _tick(self, now: float) -> None:
        flushes: list[tuple[str, str, Entry, list[int], bytes | None]] = []
        checks: list[tuple[str, str, Entry, float]] = []
        orphans: list[tuple[str, str, list[int]]] = []
        up = self.health.try_store()
        with self._lock:
            for side, table in self._tables.items():
                for key, entry in list(table.items()):
                    if now - entry.last_seen <= self._idle:
                        break  # least recently used first: the rest are younger
                    if entry.owner and up and len(checks) < _BATCH:
                        checks.append((side, key, entry, entry.last_seen))
                    elif not entry.owner or not up:
                        self._let_go(side, key, entry, "idle")
            if up:
                flushes = self._take_pending()
                orphans, self._orphans = self._orphans, []
        if not (flushes or checks or orphans):
            if up and not self.health.up:  # a probe with nothing to send: is it back?
                self._probe()
            return
        self._send_batch(flushes, checks, orphans)

    def _take_pending(self) -> list[tuple[str, str, Entry, list[int], bytes | None]]:
        """Up to a batch of the budgets' tokens counted during an outage, taken to send (under the lock)."""
        flushes: list[tuple[str, str, Entry, list[int], bytes | None]] = []
        for (side, key), entry in list(self._pending.items()):
            if len(flushes) >= _BATCH:
                break
            del self._pending[side, key]
            if entry.unsent:
                flushes.append((side, key, entry, entry.unsent, entry.tools_unsent))
                entry.unsent, entry.tools_unsent = [], None
        return flushes

    def _probe(self) -> None:
        try:
            self._redis.ping()
        except FAILURES as exc:
            self.health.failed("probe", exc)
        else:
            self.health.ok()

    def _send_batch(
        self,
        flushes: list[tuple[str, str, Entry, list[int], bytes | None]],
        checks: list[tuple[str, str, Entry, float]],
        orphans: list[tuple[str, str, list[int]]],
    ) -> None:
        """One pipelined round trip: tokens counted during an outage sent, owned idle budgets read."""
        pipe = self._redis.pipeline(transaction=False)
        for _, _, entry, increments, tools in flushes:
            self._add_script([self._key(entry.hid)], self._add_args(increments, tools, False), client=pipe)
        for side, key, increments in orphans:
            self._add_script([self._key(self._hash(side, key))], self._add_args(increments, None, False),
                             client=pipe)
        for _, _, entry, _ in checks:
            self._peek_script([self._key(entry.hid)], [self.instance], client=pipe)
        try:
            replies = pipe.execute(raise_on_error=False)
        except FAILURES as exc:
            replies = [exc] * (len(flushes) + len(orphans) + len(checks))
        failure = next((r for r in replies if isinstance(r, BaseException)), None)
        if failure is not None:
            self.health.failed("flush", failure)
        else:
            self.health.ok()
        now = time.monotonic()
        with self._lock:
            for (side, key, entry, increments, tools), reply in zip(flushes, replies[:len(flushes)], strict=True):
                if isinstance(reply, BaseException):
                    if not isinstance(reply, redis.exceptions.TimeoutError):  # not sent: sent later
                        entry.unsent[:0] = increments
                        if entry.tools_unsent is None:
                            entry.tools_unsent = tools
                        self._pending[side, key] = entry
                    continue
                entry.take_reply(reply, len(increments), False, self._window)  # claims go with its next add
            for (side, key, increments), reply in zip(orphans, replies[len(flushes):len(flushes) + len(orphans)],
                                                      strict=True):
                if (isinstance(reply, BaseException) and not isinstance(reply, redis.exceptions.TimeoutError)
                        and len(self._orphans) < _BATCH):
                    self._orphans.append((side, key, increments))
            for (side, key, entry, seen), reply in zip(checks, replies[len(flushes) + len(orphans):], strict=True):
                table = self._tables[side]
                if table.get(key) is not entry or entry.last_seen != seen:
                    continue  # a message came meanwhile: not idle
                if not isinstance(reply, BaseException):
                    exists, tokens, state, count, age_ms, mine = (int(v) for v in reply)
                    if exists and mine and age_ms <= int(self._idle_ms):  # still in use on another replica
                        entry.last_seen = now - age_ms / 1000
                        entry.tokens, entry.state, entry.calls = tokens + sum(entry.unsent), state, count
                        table.move_to_end(key)
                        continue
                    if exists and mine:  # idle everywhere: the final figures are Redis's
                        entry.tokens, entry.state, entry.calls, entry.shared = tokens, state, count, True
                self._let_go(side, key, entry, "idle")

    # ------------------------------------------------------------------ what this process counts

    def states(self, side: str) -> dict[BudgetState, int]:
        counts: dict[BudgetState, int] = dict.fromkeys(BUDGET_STATES, 0)
        with self._lock:
            for entry in self._tables[side].values():
                if entry.owner:
                    counts[BUDGET_STATES[entry.state]] += 1
        return counts

    def sessions(self, side: str) -> list[tuple[str, BudgetState]]:
        with self._lock:
            return [(key, BUDGET_STATES[e.state]) for key, e in self._tables[side].items() if e.owner]

    # ------------------------------------------------------------------ the store's thread, flush, close

    def _start_thread(self) -> None:
        with self._lock:
            if self._thread is not None or self._closed:
                return
            self._thread = threading.Thread(target=self._run, name="mcp-token-otel-budget-store", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._tick_s):
            self.expire()

    def flush(self) -> None:
        """Send now what was counted during an outage (one round trip; none when nothing waits or the store is
        still backing off)."""
        with self._lock:
            waiting = bool(self._pending or self._orphans)
        if not waiting or not self.health.try_store():
            return
        with self._lock:
            flushes = self._take_pending()
            orphans, self._orphans = self._orphans, []
        if flushes or orphans:
            self._send_batch(flushes, [], orphans)
        elif not self.health.up:
            self._probe()

    def close(self) -> None:
        """Flush, stop the store's thread and close the connections (a later call opens one again)."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        try:
            self.flush()
        finally:
            self._pool.disconnect()
