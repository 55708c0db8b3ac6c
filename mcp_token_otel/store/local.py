"""What the Redis store keeps per budget in this process, and its health: the local count it falls back on.

An entry mirrors the budget's last shared answer plus what this process counted since without the store knowing
(``unsent``: messages counted while the store was unreachable, sent when it answers again). While the store is
down, the entry answers alone: its tokens are the last shared total plus this process's own since, so a transition
fires when that estimate crosses a threshold; the states it reported are remembered (``fired``) so that the shared
claim of the same state, once the store answers again, is not reported twice by this process.
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

#: States as bits (warning 1, exhausted 2), as the script's "entered" masks and an entry's ``fired`` hold them.
#: A bit mask -> the states it holds, in order (warning before exhausted).
ENTERED: tuple[tuple[BudgetState, ...], ...] = ((), ("warning",), ("exhausted",), ("warning", "exhausted"))
#: State code (0, 1, 2) -> the mask of every state up to it.
REACHED = (0, 1, 3)
#: Messages counted during an outage are kept one by one up to this many per budget, then as their sum.
MAX_UNSENT = 64


class Entry:
    """One budget as this process knows it."""

    __slots__ = ("calls", "claimed", "fired", "hid", "last_seen", "owner", "recent", "shared", "state", "tokens",
                 "tools", "tools_unsent", "unsent")

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
        #: States claimed in the store by ``unsent`` tokens that the store's own thread sent (no message of this
        #: process went with them): reported with this process's next add to the budget.
        self.claimed = 0
        self.owner = False
        #: An answer from the store was had for this budget (its figures are then the shared ones).
        self.shared = False
        self.last_seen = now
        #: Tokens of messages the store has not seen yet (counted during an outage), in order.
        self.unsent: list[int] = []
        #: A tools/list digest compared here while the store was down: set in the store at the next send.
        self.tools_unsent: bytes | None = None
        #: The fallback's own repeat check and last tools/list digest.
        self.recent: dict[bytes, float] | None = None
        self.tools: bytes | None = None

    def count_locally(self, tokens: int, warn_at: float, exhaust_at: float, send_later: bool = True) -> int:
        """Add a message to the estimate (``send_later``: one the store has not seen, sent when it answers); the
        states (bits) the estimate entered that this process has not reported yet (it reports them now)."""
        if send_later:
            self.unsent.append(tokens)
            if len(self.unsent) > MAX_UNSENT:  # a long outage: keep the sum, not every message
                self.unsent[:] = [sum(self.unsent)]
        self.tokens += tokens
        self.calls += 1
        state = 2 if self.tokens >= exhaust_at else 1 if self.tokens >= warn_at else 0
        if state <= self.state:
            return 0
        new = REACHED[state] & ~REACHED[self.state] & ~self.fired
        self.state = state
        self.fired |= new
        return new

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

    def answer(self, window: int, source: Source, entered: int = 0, repeat: bool = False,
               changed: bool = False) -> SharedAnswer:
        """An answer from what this process knows of the budget; ``entered``: the states (bits) it reports, with
        those claimed earlier by tokens sent without a message."""
        entered, self.claimed = entered | self.claimed, 0
        return SharedAnswer(self.tokens, self.tokens / window, self.state_name, ENTERED[entered], repeat, changed,
                            self.owner, source, self.calls, window)

    def take_reply(self, reply: list[int], sent: int, message: bool, window: int) -> SharedAnswer:
        """Take the store's reply to an add of ``sent`` messages' tokens. With ``message`` (an add of this
        process: its own tokens last, any counted during an outage before them) the answer reports every state
        they claimed; without (the store's thread sent outage tokens alone) the claims wait for the next add.
        States this process already reported while the store was down are not reported again."""
        tokens, state, mine, repeat, changed, calls, created = (int(v) for v in reply[:7])
        entered = 0
        for mask in reply[7:7 + sent]:
            entered |= int(mask)
        fired = 0 if created else self.fired
        self.fired = fired & ~entered  # reported already, while the store was down: not again
        entered &= ~fired
        pending = sum(self.unsent)  # counted here while this round trip was under way
        if created:  # a new budget (or one idle past its timeout): its figures start here
            self.tokens, self.calls, self.state = tokens + pending, calls + len(self.unsent), state
        else:  # replies of concurrent adds arrive in any order: figures only grow
            self.tokens = max(self.tokens, tokens + pending)
            self.calls = max(self.calls, calls + len(self.unsent))
            self.state = max(self.state, state)
        self.owner, self.shared = bool(mine), True
        if not message:
            self.claimed |= entered
            entered = 0
        else:
            entered, self.claimed = entered | self.claimed, 0
        return SharedAnswer(tokens, tokens / window, BUDGET_STATES[state], ENTERED[entered], bool(repeat),
                            bool(changed), self.owner, "shared", calls, window)


class Health:
    """Whether the store answers: one warning per outage, one info line when it is back, and a back-off during
    which no operation tries it (one probe at a time after it)."""

    def __init__(self, name: str, backoff: float, on_error: Callable[[str], None] | None,
                 busy_when: Callable[[BaseException], bool] | None = None) -> None:
        self.name = name
        #: Which failures mean "no free connection" (the store is up, only busy) rather than an outage.
        self._busy_when = busy_when
        self.backoff = backoff
        self._on_error = on_error
        self._lock = threading.Lock()
        self.up = True
        self._retry_at = 0.0
        self._probing = False
        self._down_since = 0.0
        self._local = 0

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
        """An operation failed (``exc``) or was not tried (None: backing off): it is answered locally. A failure
        that only says no connection was free is :meth:`busy`, not an outage."""
        if exc is not None and self._busy_when is not None and self._busy_when(exc):
            self.busy(op)
            return
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

