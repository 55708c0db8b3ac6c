"""The default budget store: this process's memory, exactly the session registry's semantics and cost.

One :class:`~mcp_token_otel.core.budget.SessionRegistry` per side (bounded in count, idle budgets ended), one
lock. A call digest and a tools/list digest are kept per budget only when they are passed, and let go of with it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ..config import BudgetConfig
from ..core.budget import BudgetState, SessionBudget, SessionRegistry
from ..core.guard.limits import RateLimiter
from .base import BudgetEnd, EndCallback, SharedAnswer

#: Recent call digests kept per budget (as the recorder's own per-session check keeps).
MAX_RECENT = 32


class _Digests:
    """A budget's recent call digests (digest -> when last called, in call order) and last tools/list digest."""

    __slots__ = ("recent", "tools")

    def __init__(self) -> None:
        self.recent: dict[bytes, float] = {}
        self.tools: bytes | None = None


def check_repeat(recent: dict[bytes, float], digest: bytes, now: float, window: float) -> bool:
    """Note a call digest at ``now``: whether the same digest was called within ``window`` seconds before.
    ``recent`` keeps at most :data:`MAX_RECENT` digests, pruned by age, then oldest first."""
    last = recent.pop(digest, None)  # re-inserted below: the dict's order is the calls' order
    if len(recent) >= MAX_RECENT:
        oldest = now - window
        stale = [d for d, at in recent.items() if at < oldest]
        for d in stale or [next(iter(recent))]:
            del recent[d]
    recent[digest] = now
    return last is not None and now - last <= window


class MemoryStore:
    """Budgets counted in this process (``budget.store: memory``)."""

    shared = False

    def __init__(
        self,
        budget: BudgetConfig,
        *,
        repeat_window: float = 60.0,
        on_end: EndCallback | None = None,
        sides: tuple[str, ...] = ("client", "server", "proxy"),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lock = threading.Lock()
        self._window = budget.context_window
        self._repeat_window = repeat_window
        self._max_sessions = budget.max_sessions
        self._on_end = on_end
        self._clock = clock
        self._digests: dict[tuple[str, str], _Digests] = {}
        self._limiters: dict[tuple[str, float, int], RateLimiter] = {}
        self.registries: dict[str, SessionRegistry] = {
            side: SessionRegistry(
                budget.context_window,
                budget.warning_ratio,
                budget.exhaustion_ratio,
                max_sessions=budget.max_sessions,
                idle_timeout=budget.idle_timeout,
                clock=clock,
                on_end=self._ended(side),
            )
            for side in sides
        }

    def add(
        self,
        side: str,
        key: str,
        tokens: int,
        *,
        call_digest: bytes | None = None,
        tools_digest: bytes | None = None,
    ) -> SharedAnswer:
        with self.lock:
            update = self.registries[side].record(key, tokens)
            if call_digest is None and tools_digest is None:
                return SharedAnswer(update.tokens, update.utilization, update.state, update.transitions)
            repeat, changed = self._digest(side, key, call_digest, tools_digest)
        return SharedAnswer(update.tokens, update.utilization, update.state, update.transitions, repeat, changed)

    def _digest(self, side: str, key: str, call: bytes | None, tools: bytes | None) -> tuple[bool, bool]:
        digests = self._digests.get((side, key))
        if digests is None:
            digests = self._digests[side, key] = _Digests()
        repeat = changed = False
        if call is not None and self._repeat_window > 0:
            repeat = check_repeat(digests.recent, call, self._clock(), self._repeat_window)
        if tools is not None:
            previous, digests.tools = digests.tools, tools
            changed = previous is not None and previous != tools
        return repeat, changed

    def peek(self, side: str, key: str) -> SharedAnswer:
        budget = self.registries[side].get(key)
        if budget is None:
            return SharedAnswer(0, 0.0, "ok", context_window=self._window)
        return SharedAnswer(budget.tokens, budget.utilization, budget.state, calls=budget.calls,
                            context_window=self._window)

    def rate(self, side: str, key: str, window_s: float, limit: int, *, record_over: bool = False) -> int:
        limiter = self._limiters.get((side, window_s, limit))
        if limiter is None:
            with self.lock:
                limiter = self._limiters.setdefault(
                    (side, window_s, limit),
                    RateLimiter(limit, window_s, max_keys=self._max_sessions, clock=self._clock),
                )
        return limiter.hit(key, record_over=record_over)[1]

    def end(self, side: str, key: str) -> None:
        with self.lock:
            self.registries[side].end(key)
        for (limiter_side, _, _), limiter in list(self._limiters.items()):
            if limiter_side == side:
                limiter.forget(key)

    def expire(self) -> None:
        with self.lock:
            for registry in self.registries.values():
                registry.expire()

    def states(self, side: str) -> dict[BudgetState, int]:
        with self.lock:
            return self.registries[side].states()

    def sessions(self, side: str) -> list[tuple[str, BudgetState]]:
        with self.lock:
            return self.registries[side].sessions()

    def flush(self) -> None:
        """Nothing waits to be sent."""

    def close(self) -> None:
        """Nothing to release."""

    def _ended(self, side: str) -> Callable[[str, SessionBudget, str], None]:
        def ended(key: str, budget: SessionBudget, why: str) -> None:
            self._digests.pop((side, key), None)
            if self._on_end is not None:
                self._on_end(side, key, BudgetEnd(budget.tokens, budget.utilization, budget.state, why))

        return ended
