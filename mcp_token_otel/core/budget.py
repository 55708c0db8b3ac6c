"""Per-session context-window budgets: utilization, state and each state transition exactly once.

A session's tokens only grow (every tool call adds to the context), so states only move forward:
ok -> warning (at ``warning_ratio`` of the window) -> exhausted (at ``exhaustion_ratio``). The registry
keeps a bounded number of sessions (least recently used evicted first) and drops idle ones; each session
costs O(1) memory whatever its number of calls.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

BudgetState = Literal["ok", "warning", "exhausted"]
BUDGET_STATES: tuple[BudgetState, ...] = ("ok", "warning", "exhausted")

DEFAULT_CONTEXT_WINDOW = 200_000
DEFAULT_WARNING_RATIO = 0.75
DEFAULT_EXHAUSTION_RATIO = 0.90


def validate_budget(context_window: int, warning_ratio: float, exhaustion_ratio: float) -> None:
    """Raise ValueError naming the offending setting when a budget is inconsistent."""
    if isinstance(context_window, bool) or not isinstance(context_window, int) or context_window <= 0:
        raise ValueError(f"budget.context_window: expected a positive integer, got {context_window!r}")
    for name, ratio in (("warning_ratio", warning_ratio), ("exhaustion_ratio", exhaustion_ratio)):
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise ValueError(f"budget.{name}: expected a number in (0, 1], got {ratio!r}")
    if not warning_ratio < exhaustion_ratio:
        raise ValueError(
            "budget.warning_ratio: expected less than budget.exhaustion_ratio, "
            f"got {warning_ratio} >= {exhaustion_ratio}"
        )


@dataclass(slots=True)
class BudgetUpdate:  # read-only by convention: made twice per call, and a frozen dataclass builds 3x slower
    """What one recorded call did to its session."""

    tokens: int
    utilization: float
    state: BudgetState
    #: States entered by this call, in order (both when one call jumps from ok to exhausted).
    transitions: tuple[BudgetState, ...] = ()


class SessionBudget:
    """Cumulative tokens of one session against its context window."""

    __slots__ = ("_exhaust_at", "_warn_at", "calls", "context_window", "last_seen", "state", "tokens")

    def __init__(
        self,
        context_window: int = DEFAULT_CONTEXT_WINDOW,
        warning_ratio: float = DEFAULT_WARNING_RATIO,
        exhaustion_ratio: float = DEFAULT_EXHAUSTION_RATIO,
    ) -> None:
        validate_budget(context_window, warning_ratio, exhaustion_ratio)
        self.context_window = context_window
        self._warn_at = warning_ratio * context_window
        self._exhaust_at = exhaustion_ratio * context_window
        self.tokens = 0
        self.calls = 0
        self.state: BudgetState = "ok"
        self.last_seen = 0.0

    @property
    def utilization(self) -> float:
        """Share of the context window used; can exceed 1 when a session overflows it."""
        return self.tokens / self.context_window

    def record(self, tokens: int) -> BudgetUpdate:
        """Add one call's tokens (negative values are ignored) and report any state it entered."""
        if tokens.__class__ is not int:  # estimates are ints: int() and max() only for anything else
            tokens = max(0, int(tokens))
        if tokens > 0:
            self.tokens += tokens
        self.calls += 1
        total = self.tokens
        if total < self._warn_at or self.state == "exhausted":  # nothing to enter: no lists built
            return BudgetUpdate(total, total / self.context_window, self.state)
        entered: list[BudgetState] = []
        if self.state == "ok" and self.tokens >= self._warn_at:
            self.state = "warning"
            entered.append("warning")
        if self.state == "warning" and self.tokens >= self._exhaust_at:
            self.state = "exhausted"
            entered.append("exhausted")
        return BudgetUpdate(self.tokens, self.utilization, self.state, tuple(entered))


#: Idle sessions are looked for at most this often (seconds) while recording.
_EXPIRY_INTERVAL = 1.0

#: Called with (session_id, budget, why) when a session leaves the registry: "ended", "idle" or "evicted".
EndCallback = Callable[[str, SessionBudget, str], None]


class SessionRegistry:
    """Budgets keyed by session id, bounded in count and idle time."""

    def __init__(
        self,
        context_window: int = DEFAULT_CONTEXT_WINDOW,
        warning_ratio: float = DEFAULT_WARNING_RATIO,
        exhaustion_ratio: float = DEFAULT_EXHAUSTION_RATIO,
        *,
        max_sessions: int = 10_000,
        idle_timeout: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
        on_end: EndCallback | None = None,
    ) -> None:
        validate_budget(context_window, warning_ratio, exhaustion_ratio)
        if max_sessions < 1:
            raise ValueError(f"budget.max_sessions: expected a positive integer, got {max_sessions!r}")
        if idle_timeout <= 0:
            raise ValueError(f"budget.idle_timeout: expected a positive number, got {idle_timeout!r}")
        self._ratios = (context_window, warning_ratio, exhaustion_ratio)
        self.max_sessions = max_sessions
        self.idle_timeout = idle_timeout
        self._clock = clock
        self._on_end = on_end
        self._sessions: OrderedDict[str, SessionBudget] = OrderedDict()
        self._last_expiry = float("-inf")
        # Live sessions per state, kept up to date so states() is O(1) (it is read on every scrape).
        self._counts: dict[BudgetState, int] = dict.fromkeys(BUDGET_STATES, 0)

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def get(self, session_id: str) -> SessionBudget | None:
        return self._sessions.get(session_id)

    def record(self, session_id: str, tokens: int) -> BudgetUpdate:
        """Add tokens to a session, creating it if new; expires idle and excess sessions first."""
        now = self._clock()
        if now - self._last_expiry >= _EXPIRY_INTERVAL:  # idle expiry needs no finer grain than a second
            self._last_expiry = now
            self.expire(now)
        sessions = self._sessions
        budget = sessions.get(session_id)
        if budget is None:
            budget = SessionBudget(*self._ratios)
            self._sessions[session_id] = budget
            self._counts["ok"] += 1
            while len(self._sessions) > self.max_sessions:
                old_id, old = self._sessions.popitem(last=False)
                self._ended(old_id, old, "evicted")
        else:
            sessions.move_to_end(session_id)
        budget.last_seen = now
        before = budget.state
        update = budget.record(tokens)
        if update.state != before:
            self._counts[before] -= 1
            self._counts[update.state] += 1
        return update

    def end(self, session_id: str) -> SessionBudget | None:
        """Close a session (its connection ended); returns its final budget."""
        budget = self._sessions.pop(session_id, None)
        if budget is not None:
            self._ended(session_id, budget, "ended")
        return budget

    def expire(self, now: float | None = None) -> None:
        """Drop sessions idle for longer than the timeout (oldest first, so this stops early)."""
        now = self._clock() if now is None else now
        while self._sessions:
            session_id, budget = next(iter(self._sessions.items()))
            if now - budget.last_seen <= self.idle_timeout:
                break
            del self._sessions[session_id]
            self._ended(session_id, budget, "idle")

    def states(self) -> dict[BudgetState, int]:
        """Live sessions per state (a copy)."""
        return dict(self._counts)

    def sessions(self) -> list[tuple[str, BudgetState]]:
        """Live sessions and their states (a copy)."""
        return [(session_id, budget.state) for session_id, budget in self._sessions.items()]

    def _ended(self, session_id: str, budget: SessionBudget, why: str) -> None:
        # Every removal path (end, idle, evicted) comes through here: keep the counts right.
        self._counts[budget.state] -= 1
        if self._on_end is not None:
            self._on_end(session_id, budget, why)
