"""Budgets shared through Redis: every replica of a server or proxy counts a conversation in one place.

One add is one EVALSHA of the ``ADD`` script (scripts.py): the increment, the transitions it claims, the repeat
and tools/list checks and the budget's expiry in one atomic round trip. A request's tokens (``final=False``) are
held here and go with the next message of the same budget (its response), so a call costs one round trip; held
tokens older than ``_HOLD_S`` are sent by the store's own thread.

Faults never reach the caller: an operation past ``budget.store_timeout``, a refused connection, a restarted
Redis (its scripts are loaded again) are answered from this process's count (``source="local"``), counted through
``on_error(op)`` and logged once per outage; the store is tried again after a back-off, not at every message.
What was counted meanwhile is sent when it answers again.

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
from collections.abc import Callable, Sequence
from typing import Any

import redis

from ..config import BudgetConfig, mask_url_password
from ..core.budget import BUDGET_STATES, BudgetState
from ..core.guard.limits import RateLimiter
from . import scripts
from .base import BudgetEnd, EndCallback, ErrorCallback, KeyHasher, SharedAnswer
from .connection import FAILURES, connection_pool
from .local import MAX_HELD, Entry, Health, log

#: Called with (side, key, states) for transitions claimed by held messages the store's own thread sent.
TransitionCallback = Callable[[str, str, tuple[BudgetState, ...]], None]

#: Seconds a request's tokens may wait here for their response before the store's thread sends them.
_HOLD_S = 2.0
#: Seconds between tries of an unreachable store.
_BACKOFF_S = 1.0
#: At most this many budgets are sent or checked per pass of the store's thread (one pipelined round trip).
_BATCH = 256
#: How long a budget's keys outlive its idle timeout, so its owner can still read its final figures.
_MAX_GRACE_S = 300.0

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
        on_transition: TransitionCallback | None = None,
        backoff: float = _BACKOFF_S,
        hold: float = _HOLD_S,
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
        self._hold = hold
        self._tick_s = min(1.0, budget.idle_timeout / 4, hold / 2)
        self._on_end = on_end
        self._on_transition = on_transition
        self._sides = tuple(sides)
        self._health_args = (mask_url_password(budget.store), backoff, on_error)
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
        self._holding: dict[tuple[str, str], Entry] = {}
        self._orphans: list[tuple[str, str, list[int]]] = []
        self._limiters: dict[tuple[str, float, int], RateLimiter] = {}
        self._seq = itertools.count()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._faulted = False
        if not fresh:
            self._pool.reset()

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
                old_key, old = table.popitem(last=False)
                self._holding.pop((side, old_key), None)
                if old.unsent and len(self._orphans) < _BATCH:  # their tokens still go to the store
                    self._orphans.append((side, old_key, old.unsent))
                self._report_end(side, old_key, old, "evicted")
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
        final: bool = True,
        call_digest: bytes | None = None,
        tools_digest: bytes | None = None,
    ) -> SharedAnswer:
        try:
            return self._add(side, key, tokens, final, call_digest, tools_digest)
        except Exception as exc:  # a fault past the handled ones (ours, or the client's): the call still goes on
            self._fault("add", exc)
            return SharedAnswer(0, 0.0, "ok", owner=False, source="local", context_window=self._window)

    def _fault(self, op: str, exc: Exception) -> None:
        if not self._faulted:
            self._faulted = True
            log.warning("budget store: unexpected %s in %s; answered locally", type(exc).__name__, op, exc_info=exc)
        self.health.busy(op)

    def _add(
        self,
        side: str,
        key: str,
        tokens: int,
        final: bool,
        call_digest: bytes | None,
        tools_digest: bytes | None,
    ) -> SharedAnswer:
        if tokens.__class__ is not int or tokens < 0:
            tokens = max(0, int(tokens))
        if self._thread is None:
            self._start_thread()
        now = time.monotonic()
        with self._lock:
            entry = self._entry(side, key, now)
            # A budget this process has no shared figures for yet sends its first message at once (it learns the
            # total and who owns it); after that a request waits for its response.
            if not final and entry.shared and tools_digest is None and len(entry.unsent) < MAX_HELD and self.health.up:
                if not entry.unsent:
                    entry.unsent_since = now
                    self._holding[side, key] = entry
                entry.unsent.append(tokens)
                entry.tokens += tokens
                entry.calls += 1
                if call_digest is not None:
                    entry.unsent_calls.append(call_digest)
                return entry.answer(self._window, "held")
        if not self.health.try_store():
            return self._local(side, key, "add", entry, tokens, [], call_digest, tools_digest, None)
        with self._lock:
            increments, entry.unsent = [*entry.unsent, tokens], []
            calls, entry.unsent_calls = entry.unsent_calls, []
            deferred, entry.tools_unsent = entry.tools_unsent, None
            self._holding.pop((side, key), None)
        if call_digest is not None:
            calls.append(call_digest)
        tools = tools_digest if tools_digest is not None else deferred
        try:
            reply = self._add_script(
                [self._key(entry.hid), *self._repeat_keys(entry.hid, calls)],
                self._add_args(increments, tools, tools_digest is not None),
            )
        except FAILURES as exc:
            return self._local(side, key, "add", entry, tokens, increments[:-1], call_digest, tools_digest, exc,
                               calls)
        self.health.ok()
        with self._lock:
            answer = self._shared(entry, reply, len(increments))
        return answer

    def _add_args(self, increments: list[int], tools: bytes | None, report: bool, release: bool = False) -> list[Any]:
        return [self._idle_ms, self._ttl_ms, self._warn_arg, self._exhaust_arg, self.instance, self._repeat_ms,
                tools if tools is not None else b"", "1" if report else "0", "1" if release else "0", *increments]

    def _shared(self, entry: Entry, reply: list[int], sent: int, message: bool = True) -> SharedAnswer:
        """An ADD reply taken into the entry (under the lock)."""
        return entry.take_reply(reply, sent, message, self._window)

    def _local(
        self,
        side: str,
        key: str,
        op: str,
        entry: Entry,
        tokens: int,
        held: list[int],
        call_digest: bytes | None,
        tools_digest: bytes | None,
        exc: BaseException | None,
        calls: list[bytes] | None = None,
    ) -> SharedAnswer:
        """Answer from this process's count (the store failed with ``exc``, or is backing off: None)."""
        delivered = isinstance(exc, redis.exceptions.TimeoutError)  # sent, maybe applied: never sent twice
        with self._lock:
            if held and not delivered:
                entry.unsent[:0] = held
            transitions = entry.count_locally(tokens, self._warn_at, self._exhaust_at, send_later=not delivered)
            if entry.unsent:
                self._holding[side, key] = entry
            repeat = False
            for digest in calls or []:  # held digests sent in vain: checked here
                repeat = entry.check_locally(digest, None, self._repeat_window)[0] or repeat
            if not calls:
                repeat = entry.check_locally(call_digest, None, self._repeat_window)[0]
            changed = entry.check_locally(None, tools_digest, self._repeat_window)[1]
            answer = entry.answer(self._window, "local", transitions, repeat, changed)
        self._failed(op, exc)
        return answer

    @staticmethod
    def _is_busy(exc: BaseException | None) -> bool:
        return isinstance(exc, redis.exceptions.ConnectionError) and "Too many connections" in str(exc)

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
                return entry.answer(self._window, "shared")
            held: list[int] = []
            calls: list[bytes] = []
            if entry is not None and entry.unsent and self.health.up:
                held, entry.unsent, calls, entry.unsent_calls = entry.unsent, [], entry.unsent_calls, []
                self._holding.pop((side, key), None)
        if not self.health.try_store():
            return self._peek_locally(entry, None)
        try:
            if entry is not None and held:  # the held tokens go with the read: its answer counts them
                reply = self._add_script([self._key(entry.hid), *self._repeat_keys(entry.hid, calls)],
                                         self._add_args(held, None, False))
            else:
                hid = entry.hid if entry is not None else self._hash(side, key)
                reply = self._peek_script([self._key(hid)], [self.instance])
        except FAILURES as exc:
            if entry is not None and held and not isinstance(exc, redis.exceptions.TimeoutError):
                with self._lock:
                    entry.unsent[:0] = held
                    self._holding[side, key] = entry
            return self._peek_locally(entry, exc)
        self.health.ok()
        if entry is not None and held:
            with self._lock:
                return self._shared(entry, reply, len(held), message=False)
        exists, tokens, state, count, age_ms, mine = (int(v) for v in reply)
        if not exists or age_ms > int(self._idle_ms):  # ended: its next message starts afresh
            return SharedAnswer(0, 0.0, "ok", source="shared", owner=False, context_window=self._window)
        if entry is not None:
            with self._lock:
                entry.tokens, entry.state, entry.calls, entry.owner, entry.shared = (
                    tokens + sum(entry.unsent), max(entry.state, state), count, bool(mine), True)
        return SharedAnswer(tokens, tokens / self._window, BUDGET_STATES[state], owner=bool(mine), source="shared",
                            calls=count, context_window=self._window)

    def _peek_locally(self, entry: Entry | None, exc: BaseException | None) -> SharedAnswer:
        self._failed("peek", exc)
        if entry is None:
            return SharedAnswer(0, 0.0, "ok", owner=False, source="local", context_window=self._window)
        with self._lock:
            return entry.answer(self._window, "local")

    def rate(self, side: str, key: str, window_s: float, limit: int, *, record_over: bool = False) -> int:
        try:
            return self._rate(side, key, window_s, limit, record_over)
        except Exception as exc:
            self._fault("rate", exc)
            return 1

    def _rate(self, side: str, key: str, window_s: float, limit: int, record_over: bool) -> int:
        if self.health.try_store():
            with self._lock:
                entry = self._tables[side].get(key)
            hid = entry.hid if entry is not None else self._hash(side, key)
            try:
                count = self._rate_script(
                    [f"{self._prefix}{{{hid}}}:q"],
                    [str(max(1, round(window_s * 1_000_000))), str(limit), "1" if record_over else "0",
                     f"{self.instance}:{next(self._seq)}"],
                )
            except FAILURES as exc:
                self._failed("rate", exc)
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
        """The budget's connection ended here: what it held is sent, its owner reports the end with the shared
        figures and gives up ownership (the next replica to add to it counts it from then on)."""
        try:
            self._end(side, key)
        except Exception as exc:
            self._fault("end", exc)

    def _end(self, side: str, key: str) -> None:
        with self._lock:
            entry = self._tables[side].pop(key, None)
            self._holding.pop((side, key), None)
        if entry is None:
            return
        source = "shared" if entry.shared else "local"
        if (entry.owner or entry.unsent) and not self.health.try_store():
            source = "local"
            with self._lock:  # sent by the store's thread once Redis answers
                if entry.unsent and len(self._orphans) < _BATCH:
                    self._orphans.append((side, key, entry.unsent))
        elif entry.owner or entry.unsent:
            try:
                reply = self._add_script(
                    [self._key(entry.hid), *self._repeat_keys(entry.hid, entry.unsent_calls)],
                    self._add_args(entry.unsent, entry.tools_unsent, False, release=entry.owner),
                )
            except FAILURES as exc:
                self._failed("end", exc)
                source = "local"
                if entry.unsent and not isinstance(exc, redis.exceptions.TimeoutError):
                    with self._lock:  # still sent, by the store's thread, once Redis answers
                        if len(self._orphans) < _BATCH:
                            self._orphans.append((side, key, entry.unsent))
            else:
                self.health.ok()
                sent, entry.unsent = len(entry.unsent), []
                with self._lock:
                    self._shared(entry, reply, sent, message=False)
        with self._lock:
            self._report_end(side, key, entry, "ended", source)

    def _failed(self, op: str, exc: BaseException | None) -> None:
        """``op`` failed with ``exc``: answered locally. A pool with no free connection is no outage."""
        if self._is_busy(exc):
            self.health.busy(op)
        else:
            self.health.failed(op, exc)

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
        """One pass of the store's own thread, now: held tokens past their time are sent, budgets idle here
        are ended (an owned one only once Redis says it is idle everywhere, with its final figures)."""
        try:
            self._tick(time.monotonic())
        except Exception:  # never raises: the next pass tries again
            log.debug("budget store pass failed", exc_info=True)

    def _tick(self, now: float) -> None:
        flushes: list[tuple[str, str, Entry, list[int], list[bytes]]] = []
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
                        del table[key]
                        self._holding.pop((side, key), None)
                        if entry.unsent and len(self._orphans) < _BATCH:
                            self._orphans.append((side, key, entry.unsent))
                        self._report_end(side, key, entry, "idle")
            if up:
                for (side, key), entry in list(self._holding.items()):
                    if len(flushes) >= _BATCH:
                        break
                    if not entry.unsent:
                        del self._holding[side, key]
                    elif now - entry.unsent_since >= self._hold:
                        flushes.append((side, key, entry, entry.unsent, entry.unsent_calls))
                        entry.unsent, entry.unsent_calls = [], []
                        del self._holding[side, key]
                orphans, self._orphans = self._orphans, []
        if not (flushes or checks or orphans):
            if up and not self.health.up:  # a probe with nothing to send: is it back?
                self._probe()
            return
        self._send_batch(flushes, checks, orphans)

    def _probe(self) -> None:
        try:
            self._redis.ping()
        except FAILURES as exc:
            self.health.failed("probe", exc)
        else:
            self.health.ok()

    def _send_batch(
        self,
        flushes: list[tuple[str, str, Entry, list[int], list[bytes]]],
        checks: list[tuple[str, str, Entry, float]],
        orphans: list[tuple[str, str, list[int]]],
    ) -> None:
        """One pipelined round trip: held tokens sent, owned idle budgets read."""
        pipe = self._redis.pipeline(transaction=False)
        for _, _, entry, increments, calls in flushes:
            self._add_script([self._key(entry.hid), *self._repeat_keys(entry.hid, calls)],
                             self._add_args(increments, None, False), client=pipe)
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
            self._failed("flush", failure)
        else:
            self.health.ok()
        claimed: list[tuple[str, str, tuple[BudgetState, ...]]] = []
        now = time.monotonic()
        with self._lock:
            for (side, key, entry, increments, _), reply in zip(flushes, replies[:len(flushes)], strict=True):
                if isinstance(reply, BaseException):
                    if not isinstance(reply, redis.exceptions.TimeoutError):
                        entry.unsent[:0] = increments
                        self._holding[side, key] = entry
                    continue
                answer = self._shared(entry, reply, len(increments), message=False)
                if answer.held_transitions:
                    claimed.append((side, key, answer.held_transitions))
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
                del table[key]
                self._holding.pop((side, key), None)
                self._report_end(side, key, entry, "idle")
        if self._on_transition is not None:
            for side, key, states in claimed:
                try:
                    self._on_transition(side, key, states)
                except Exception:
                    log.debug("budget store transition callback failed", exc_info=True)

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
        """Send every held message now (one round trip; none when nothing is held)."""
        with self._lock:
            flushes = [(side, key, entry, entry.unsent, entry.unsent_calls)
                       for (side, key), entry in self._holding.items() if entry.unsent]
            for _, _, entry, _, _ in flushes:
                entry.unsent, entry.unsent_calls = [], []
            self._holding.clear()
            orphans, self._orphans = self._orphans, []
        if (flushes or orphans) and self.health.try_store():
            self._send_batch(flushes, [], orphans)

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
