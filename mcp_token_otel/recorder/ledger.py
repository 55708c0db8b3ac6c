"""The session ledger: per-side context-window budgets and what the metrics need per live session.

The budgets themselves live in the budget store (``budget.store``: this process's memory by default, or a Redis
that every replica shares); the ledger keeps, beside them, each live session's metadata (its server, transport,
protocol, the naming request held for its answer). A budget is keyed by what the adapter resolved from
``budget.key`` (a session, a conversation, a principal...); the ledger does not care which. Budgets the store lets
go of (ended, idle past ``budget.idle_timeout``, evicted at ``budget.max_sessions``) are noted under the store's
lock and reported after it, so nothing that reads the ledger ever runs while it is held. The per-session metadata
is bounded too: past ``budget.max_sessions`` per side the least recently used is evicted and reported, never the
whole table at once.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any, Literal

from ..config import BudgetConfig
from ..core.budget import BUDGET_STATES, SessionRegistry
from ..core.labels import UNKNOWN_SERVER
from ..core.measure import Measurement
from ..semconv import A_TRANSPORT
from ..store import BudgetEnd, BudgetStore, SharedAnswer, open_store
from ..store.base import state_of

Side = Literal["client", "server", "proxy"]
SIDES: tuple[Side, ...] = ("client", "server", "proxy")

#: A naming request's metric point held back until its answer names the server: side, method, tool, measurement.
Held = tuple[Side, str, "str | None", Measurement]
#: A session's end reported after the lock: side, final utilization, its metadata, why (ended, idle, evicted).
Ended = tuple[Side, float, "SessionMeta | None", str]
#: Live sessions per (side, server label) past which session_states() stops remembering pairs to keep at 0.
_MAX_SERVER_PAIRS = 1_000


def _zeros() -> dict[str, int]:
    return {state: 0 for state in BUDGET_STATES}


class SessionMeta:
    """What the recorder keeps per live session for its metrics: when it began, which server it is, and the
    little its context costs need (see context_costs.py), all of it let go of with the session."""

    __slots__ = ("label", "pending", "protocol", "server", "started", "tools_paged", "transport")

    def __init__(self, server: str | None, transport: str | None) -> None:
        self.started = time.monotonic()
        self.server = server
        self.transport = transport
        self.protocol: str | None = None
        #: The session's bounded ``server`` label, once computed (cleared when the session learns its server).
        self.label: str | None = None
        #: A client's initialize request, recorded once its result names the server (see record_input).
        self.pending: Held | None = None
        #: Whether the session's last tools/list result had more pages (the next one continues the listing).
        self.tools_paged = False


class SessionLedger:
    """Budgets (in the store) and metadata of the live sessions, per side, bounded in count."""

    def __init__(
        self,
        budget: BudgetConfig,
        fault: Callable[[str], None],
        ended: Callable[[Side, float, SessionMeta | None, str], None],
        evicted: Callable[[Side, SessionMeta], None],
        *,
        repeat_window: float = 0.0,
        store_error: Callable[[str], None] | None = None,
    ) -> None:
        self._fault = fault
        self._report_end = ended
        self._report_evicted = evicted
        # The metadata of a session is made at its first request, its budget at its first answer: the budgets' own
        # bound (the store's least recently used end, reported with their metadata) acts first; this one only
        # bounds what the store never saw (a budget fault, requests that never got an answer).
        self._max_meta = 2 * budget.max_sessions
        self._budget = budget
        # Sessions ended under the store's lock, to report after it.
        self._ended: deque[Ended] = deque()
        #: Sessions to end at the next safe point (end_soon: garbage-collection callbacks). Read on every message.
        self.ending: deque[tuple[Side, str]] = deque()
        self._meta: dict[str, OrderedDict[str, SessionMeta]] = {side: OrderedDict() for side in SIDES}
        self._server_pairs: set[tuple[str, str]] = set()  # (side, server) pairs the sessions gauge shows
        #: Where the budgets are counted (``budget.store``).
        self.store: BudgetStore = open_store(budget, repeat_window=repeat_window, on_end=self._on_end,
                                             on_error=store_error)
        #: Whether the budgets are shared with other processes (a Redis store).
        self.shared = self.store.shared
        #: The in-process budget registries per side (the memory store's), for inspection; empty when shared.
        self.sessions: dict[str, SessionRegistry] = getattr(self.store, "registries", {})

    def record(self, side: Side, key: str | None, tokens: int, call_digest: bytes | None = None,
               tools_digest: bytes | None = None) -> SharedAnswer | None:
        """Add ``tokens`` to the budget ``key`` (None: no budget, or a fault); ``call_digest`` asks whether this
        tools/call repeats one within ``metrics.repeat_window``, ``tools_digest`` whether this tools/list changed."""
        if key is None:
            if self._ended:  # budgets that went idle at a collection: reported at this safe point
                self.report_ended()
            return None
        try:
            answer = self.store.add(side, key, tokens, call_digest=call_digest, tools_digest=tools_digest)
        except Exception:
            self._fault("budget")
            return None
        if self._ended:  # idle or evicted sessions the store let go of while recording
            self.report_ended()
        return answer

    def budget(self, side: Side, key: str | None, pending: int = 0) -> SharedAnswer | None:
        """The budget as it stands (the guards read it; a shared store is asked), or None. ``pending``: tokens of
        the current call not added yet (its request's, added with its answer), counted in."""
        if key is None:
            return None
        try:
            view = self.store.peek(side, key)
        except Exception:
            self._fault("budget")
            return None
        if not pending:
            return view
        budget = self._budget
        tokens = view.tokens + pending
        window = budget.context_window
        state = state_of(tokens, window * budget.warning_ratio, window * budget.exhaustion_ratio)
        return SharedAnswer(tokens, tokens / window, state, calls=view.calls, context_window=window)

    def rate(self, side: Side, key: str, window: float, limit: int, record_over: bool) -> int:
        """One event of ``key`` in a sliding window shared with every replica: the events in it, this one
        included (the rate-limit guard of a shared deployment)."""
        return self.store.rate(side, key, window, limit, record_over=record_over)

    def meta(
        self, side: Side, key: str | None, server: str | None, attributes: Mapping[str, Any] | None
    ) -> SessionMeta | None:
        """The session's metric context, created at its first message (the session's start); most recently used."""
        if key is None:
            return None
        try:
            metas = self._meta[side]
            meta = metas.get(key)
            if meta is None:
                meta = metas[key] = SessionMeta(
                    server or None, attributes.get(A_TRANSPORT) if attributes else None
                )
                if len(metas) > self._max_meta:
                    self._evict(side, metas)
                return meta
            try:
                metas.move_to_end(key)
            except KeyError:  # ended meanwhile on another thread: this message still has its context
                return meta
            if server and meta.server is None:
                meta.server, meta.label = server, None
            if attributes and meta.transport is None:
                meta.transport = attributes.get(A_TRANSPORT)
            return meta
        except Exception:
            self._fault("metrics")
            return None

    def find_meta(self, side: Side, key: str | None) -> SessionMeta | None:
        """The session's metric context if it has one (a lookup: creates nothing)."""
        return self._meta[side].get(key) if key is not None else None

    def _evict(self, side: Side, metas: OrderedDict[str, SessionMeta]) -> None:
        # Sessions whose budget the registry let go of lose their metadata with it; what is left past the bound
        # are sessions the registry never saw end (a budget fault): the least recently used goes, and is counted.
        while len(metas) > self._max_meta:
            try:
                _, old = metas.popitem(last=False)
            except KeyError:  # emptied meanwhile on another thread
                return
            self._report_evicted(side, old)

    def end(self, side: Side, key: str) -> None:
        """Close the session's budget (its final utilization is reported)."""
        try:
            self.store.end(side, key)
        except Exception:
            self._fault("budget")
        self.report_ended()

    def expire(self) -> None:
        """End the budgets idle past ``budget.idle_timeout`` on every side (each side's own traffic does it for
        that side too). Noted only: :meth:`report_ended` reports them."""
        try:
            self.store.expire()
        except Exception:
            self._fault("budget")

    def end_soon(self, side: Side, key: str) -> None:
        """Queue the session's end for the next safe point (nothing else: see TokenRecorder.end_session_soon)."""
        self.ending.append((side, key))

    def _on_end(self, side: str, key: str, end: BudgetEnd) -> None:
        # Called by the store under its lock: only note it; report_ended() reports it after the lock. A budget
        # shared with other replicas is reported by its owner only (counted once).
        meta = self._meta[side].pop(key, None)
        if end.owner:
            self._ended.append((side, end.utilization, meta, end.why))  # type: ignore[arg-type]

    def close(self) -> None:
        """Send what the store still holds and release its connections."""
        try:
            self.store.close()
        except Exception:
            self._fault("budget")

    @property
    def ended_waiting(self) -> bool:
        """Whether ended budgets wait to be reported (:meth:`report_ended`)."""
        return bool(self._ended)

    def report_ended(self) -> None:
        while self._ended:
            try:
                ended = self._ended.popleft()
            except IndexError:  # another thread took the last one
                return
            self._report_end(*ended)

    def states(self) -> dict[str, dict[str, int]]:
        """Live sessions per budget state, per side (a shared budget counts on its owner only)."""
        return {side: {state: n for state, n in self.store.states(side).items()} for side in SIDES}

    def session_states(self, label: Callable[[SessionMeta | None], str]) -> dict[tuple[str, str], dict[str, int]]:
        """Live sessions per (side, server label) and budget state, every state present. A (side, server) seen
        once keeps its series at 0 when its sessions end; the default's (``label(None)``, under which sessions with
        no known server count) show while it is the default."""
        # Budgets idle past the timeout end here too, so a quiet process's gauges do not keep them; a sink is
        # reading this, so their ends are reported at the next safe point (a message, a session's end, close).
        self.expire()
        live = {side: self.store.sessions(side) for side in SIDES}
        default = label(None)
        out: dict[tuple[str, str], dict[str, int]] = {key: _zeros() for key in self._server_pairs}
        labels: dict[str | None, str] = {None: default}  # a session's label depends only on its meta.server
        for side, sessions in live.items():
            if default != UNKNOWN_SERVER:  # a configured name shows its sides at 0; a placeholder only when used
                out.setdefault((side, default), _zeros())
            metas = self._meta[side]
            for key, state in sessions:
                meta = metas.get(key)
                name = meta.server if meta is not None else None
                server = labels.get(name)
                if server is None:
                    server = labels[name] = label(meta)
                counts = out.get((side, server))
                if counts is None:
                    counts = out[side, server] = _zeros()
                counts[state] += 1
        if len(out) <= _MAX_SERVER_PAIRS:  # labels are bounded; this bounds the set whatever happens
            # Not the default: shown at every read while it is the default; a stand-in (a proxy's name from its
            # command line, _unknown) is not kept once the server has named itself.
            self._server_pairs = {pair for pair in out if pair[1] != default}
        return out
