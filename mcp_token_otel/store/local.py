"""What the Redis store keeps per budget in this process, and its health: the local count it falls back on.

An entry mirrors the budget's last shared answer plus what this process added since without the store knowing
(``unsent``: requests held for the next message, or messages counted while the store was unreachable). While
the store is down, the entry answers alone: its tokens are the last shared total plus this process's own since, so
a transition fires when that estimate crosses a threshold; the states it reported are remembered (``fired``) so
that the shared claim of the same state, once the store answers again, is not reported twice by this process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..core.budget import BUDGET_STATES, BudgetState
from .base import SharedAnswer, Source
from .memory import check_repeat

log = logging.getLogger("mcp_token_otel.store")

#: Bits of a state: the script's "entered" masks and an entry's ``fired`` use them.
STATE_BITS: dict[BudgetState, int] = {"ok": 0, "warning": 1, "exhausted": 2}
#: A bit mask -> the states it holds, in order (warning before exhausted).
ENTERED: tuple[tuple[BudgetState, ...], ...] = ((), ("warning",), ("exhausted",), ("warning", "exhausted"))
#: State code (0, 1, 2) -> the mask of every state up to it.
REACHED = (0, 1, 3)
#: Messages held per budget at most: the next one goes to the store with them.
MAX_HELD = 16


class Entry:
    """One budget as this process knows it."""

    __slots__ = ("calls", "fired", "hid", "last_seen", "owner", "recent", "shared", "state", "tokens", "tools",
                 "tools_unsent", "unsent", "unsent_calls", "unsent_since")

    def __init__(self, hid: str, now: float) -> None:
        self.hid = hid
        #: Best estimate: the last shared total plus ``unsent``.
        self.tokens = 0
        self.calls = 0
        #: 0 ok, 1 warning, 2 exhausted: the highest state known here.
        self.state = 0
        #: States this process reported from its own count while the store was down (bits): the store's claim of
        #: the same state, once it answers, is not reported again.
        self.fired = 0
        self.owner = False
        #: An answer from the store was had for this budget (its figures are then the shared ones).
        self.shared = False
        self.last_seen = now
        #: Tokens of messages the store has not seen yet, in order, and since when.
        self.unsent: list[int] = []
        self.unsent_since = now
        #: Call digests held with them (checked for a repeat when they are sent).
        self.unsent_calls: list[bytes] = []
        #: A tools/list digest compared here while the store was down: set in the store at the next send.
        self.tools_unsent: bytes | None = None
        #: The fallback's own repeat check and last tools/list digest.
        self.recent: dict[bytes, float] | None = None
        self.tools: bytes | None = None

    def count_locally(
        self, tokens: int, warn_at: float, exhaust_at: float, send_later: bool = True
    ) -> tuple[BudgetState, ...]:
        """Add a message to the estimate (``send_later``: one the store has not seen, sent when it answers); the
        states the estimate entered that this process has not reported yet (it reports them now)."""
        if send_later:
            self.unsent.append(tokens)
            if len(self.unsent) == 1:
                self.unsent_since = time.monotonic()
            elif len(self.unsent) > 4 * MAX_HELD:  # a long outage: keep the sum, not every message
                self.unsent[:] = [sum(self.unsent)]
        self.tokens += tokens
        self.calls += 1
        state = 2 if self.tokens >= exhaust_at else 1 if self.tokens >= warn_at else 0
        if state <= self.state:
            return ()
        new = REACHED[state] & ~REACHED[self.state] & ~self.fired
        self.state = state
        self.fired |= new
        return ENTERED[new]

    def check_locally(self, call: bytes | None, tools: bytes | None, window: float) -> tuple[bool, bool]:
        """The repeat and tools/list checks on this process's own history (the store is down)."""
        repeat = changed = False
        if call is not None and window > 0:
            if self.recent is None:
                self.recent = {}
            repeat = check_repeat(self.recent, call, time.monotonic(), window)
        if tools is not None:
            previous, self.tools = self.tools, tools
            changed = previous is not None and previous != tools
            self.tools_unsent = tools
        return repeat, changed

    @property
    def state_name(self) -> BudgetState:
        return BUDGET_STATES[self.state]

    def answer(
        self,
        window: int,
        source: Source,
        transitions: tuple[BudgetState, ...] = (),
        repeat: bool = False,
        changed: bool = False,
    ) -> SharedAnswer:
        """An answer from what this process knows of the budget."""
        return SharedAnswer(self.tokens, self.tokens / window, self.state_name, transitions, (), repeat, changed,
                            self.owner, source, self.calls, window)

    def take_reply(self, reply: list[int], sent: int, message: bool, window: int) -> SharedAnswer:
        """Take the store's reply to an add of ``sent`` messages: the answer for the last one (``message``; else
        they were all held), the held ones' transitions apart. States this process already reported while the
        store was down are not reported again."""
        tokens, state, mine, repeat, changed, calls, created = (int(v) for v in reply[:7])
        masks = [int(v) for v in reply[7:7 + sent]]
        fired = 0 if created else self.fired
        own = masks.pop() if message and masks else 0
        held = 0
        for mask in masks:
            held |= mask
        self.fired = fired & ~(own | held)  # reported already, while the store was down: not again
        own &= ~fired
        held &= ~fired
        pending = sum(self.unsent)  # added here while this round trip was under way
        if created:  # a new budget (or one idle past its timeout): its figures start here
            self.tokens, self.calls, self.state = tokens + pending, calls + len(self.unsent), state
        else:  # replies of concurrent adds arrive in any order: figures only grow
            self.tokens = max(self.tokens, tokens + pending)
            self.calls = max(self.calls, calls + len(self.unsent))
            self.state = max(self.state, state)
        self.owner, self.shared = bool(mine), True
        return SharedAnswer(tokens, tokens / window, BUDGET_STATES[state], ENTERED[own], ENTERED[held], bool(repeat),
                            bool(changed), self.owner, "shared", calls, window)


class Health:
    """Whether the store answers: one warning per outage, one info line when it is back, and a back-off during
    which no operation tries it (one probe at a time after it)."""

    def __init__(self, name: str, backoff: float, on_error: Callable[[str], None] | None) -> None:
        self.name = name
        self.backoff = backoff
        self._on_error = on_error
        self._lock = threading.Lock()
        self.up = True
        self._retry_at = 0.0
        self._probing = False
        self._down_since = 0.0
        self._local = 0
        #: Outages seen so far (each logged once).
        self.outages = 0

    def try_store(self) -> bool:
        """Whether this operation may use the store: always while it is up; after the back-off, one probe."""
        if self.up:
            return True
        now = time.monotonic()
        with self._lock:
            if self.up:
                return True
            if self._probing or now < self._retry_at:
                return False
            self._probing = True
            return True

    def ok(self) -> None:
        if self.up:
            return
        with self._lock:
            if self.up:
                return
            self.up, self._probing = True, False
            down_for, answered = time.monotonic() - self._down_since, self._local
        log.info("budget store %s answers again after %.1f s (%d operations were answered locally meanwhile)",
                 self.name, down_for, answered)

    def failed(self, op: str, exc: BaseException | None) -> None:
        """An operation failed (``exc``) or was not tried (None: backing off): it is answered locally."""
        now = time.monotonic()
        first = False
        with self._lock:
            self._local += 1
            if exc is not None:
                if self.up:
                    first = True
                    self.up = False
                    self._down_since = now
                    self._local = 1
                    self.outages += 1
                self._retry_at = now + self.backoff
                self._probing = False
        if first:
            log.warning("budget store %s unreachable (%s: %s): budgets are counted in this process until it "
                        "answers again (tried again every %g s)", self.name, type(exc).__name__, exc, self.backoff)
        if self._on_error is not None:
            try:
                self._on_error(op)
            except Exception:  # a callback's fault is not the store's: the answer still goes out
                log.debug("budget store error callback failed", exc_info=True)

    def busy(self, op: str) -> None:
        """No connection was free within the deadline: this operation is answered locally, the store stays up."""
        with self._lock:
            self._local += 1
        if self._on_error is not None:
            try:
                self._on_error(op)
            except Exception:
                log.debug("budget store error callback failed", exc_info=True)

