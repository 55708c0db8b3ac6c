"""What every budget store answers, and the protocol the session ledger calls.

A store counts the tokens of each budget (``budget.key``: a session, a conversation, a principal) per side, and
answers per message: the budget's cumulative tokens, its state, the transitions this message claimed, whether a
tools/call repeats one within ``metrics.repeat_window`` and whether a tools/list changed. ``MemoryStore`` counts in
this process (the default); ``RedisStore`` counts in a Redis that every replica of a server or proxy shares, so a
conversation spread over N replicas has one budget and each transition is claimed once for all of them.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from ..core.budget import BudgetState

#: What an answer was decided on: ``shared`` (the shared store, in the same round trip) or ``local`` (this
#: process's count: the memory store, or the shared store unreachable, slow or backing off after a failure).
Source = Literal["shared", "local"]

#: Called with the operation (``add``, ``peek``, ``rate``) each time one is answered locally because the shared
#: store failed, timed out or is backing off after a failure.
ErrorCallback = Callable[[str], None]


@dataclass(slots=True)
class SharedAnswer:
    """What one added message did to its budget (it also reads as the budget's view: ``state``, ``tokens``)."""

    #: The budget's cumulative tokens, all replicas included (as far as ``source`` knows).
    tokens: int
    utilization: float
    state: BudgetState
    #: States this add entered, each claimed once across every replica, in order (with a shared store, states
    #: claimed by tokens this process counted during an outage and sent later come with its next add).
    transitions: tuple[BudgetState, ...] = ()
    #: A call digest sent with this add was seen in this budget within ``metrics.repeat_window`` (any replica).
    repeat: bool = False
    #: The tools/list digest sent with this add differs from the budget's previous one (any replica).
    tools_changed: bool = False
    #: This process counts the budget in the sessions gauge and observes its utilization at its end: the
    #: replica whose add created it in the shared store (always true for the memory store).
    owner: bool = True
    source: Source = "local"
    #: Messages added to the budget so far (any replica); 0 in the memory store's add answers (its peek has them).
    calls: int = 0
    context_window: int = 0


@dataclass(slots=True)
class BudgetEnd:
    """A budget this process let go of: its final figures and why (``ended``, ``idle``, ``evicted``)."""

    tokens: int
    utilization: float
    state: BudgetState
    why: str
    #: Only the owner observes the end (the sessions gauge and the utilization histogram count it once).
    owner: bool = True
    source: Source = "local"


#: Called with (side, budget key, its end) when a budget leaves the store's table. It runs under the store's lock:
#: it only notes the end (the ledger reports it after the lock, as it does today).
EndCallback = Callable[[str, str, BudgetEnd], None]


class BudgetStore(Protocol):
    """The budget operations the session ledger calls (every method is synchronous, short and never raises)."""

    #: True when budgets are shared with other processes (a ``SharedAnswer.source`` can then be ``shared``).
    shared: bool

    def add(
        self,
        side: str,
        key: str,
        tokens: int,
        *,
        call_digest: bytes | None = None,
        tools_digest: bytes | None = None,
    ) -> SharedAnswer:
        """Count one call's tokens (its request's and its answer's, added once when the call ends: one round
        trip with a shared store). ``call_digest``: a tools/call's (tool, arguments) digest, checked for a
        repeat; ``tools_digest``: a tools/list's (first page's) digest, compared with the budget's previous one.
        Digests must be stable across processes (:func:`stable_digest`), not ``hash()``."""
        ...

    def peek(self, side: str, key: str) -> SharedAnswer:
        """The budget as it stands (a request-side guard reads it); an unknown budget is empty and ``ok``."""
        ...

    def rate(self, side: str, key: str, window_s: float, limit: int, *, record_over: bool = False) -> int:
        """Count one event of ``key`` in a sliding window of ``window_s`` seconds: the events in the window, this
        one included. Past ``limit`` the event is not logged unless ``record_over`` (as ``RateLimiter.hit``)."""
        ...

    def end(self, side: str, key: str) -> None:
        """The budget's connection ended here: its end is reported (``why="ended"``)."""
        ...

    def expire(self) -> None:
        """End the budgets idle past ``budget.idle_timeout`` (reported with ``why="idle"``)."""
        ...

    def states(self, side: str) -> dict[BudgetState, int]:
        """Budgets this process counts (it owns them), per state."""
        ...

    def sessions(self, side: str) -> list[tuple[str, BudgetState]]:
        """Budgets this process counts and their states (a copy)."""
        ...

    def flush(self) -> None:
        """Send now what was counted here while the shared store was unreachable (at close)."""
        ...

    def close(self) -> None:
        """Flush, then release connections; later calls answer locally."""
        ...


def stable_digest(*parts: bytes | str) -> bytes:
    """A 16-byte digest of ``parts`` that every process computes alike (for ``call_digest``, ``tools_digest``):
    of their ``repr``, which keeps the parts apart (quoted, escaped)."""
    return hashlib.blake2b(repr(parts).encode("utf-8", "surrogatepass"), digest_size=16).digest()


class KeyHasher:
    """Budget keys as they are stored: HMAC-SHA256 of (side, key) under a secret, 32 hex characters.

    With ``secret`` empty the HMAC key is derived from ``prefix``: keys stay unreadable to anyone reading the
    store, but someone who can read it and guess a candidate key (a user name, an e-mail) can confirm the guess.
    A ``budget.store_key_secret``, the same on every replica, closes that."""

    __slots__ = ("_key",)

    def __init__(self, prefix: str, secret: str = "") -> None:
        material = secret.encode("utf-8") if secret else b"mcp-token-otel budget keys\x00" + prefix.encode("utf-8")
        self._key = hashlib.sha256(material).digest()

    def __call__(self, side: str, key: str) -> str:
        msg = side.encode("utf-8") + b"\x00" + key.encode("utf-8", "surrogatepass")
        return hmac.new(self._key, msg, hashlib.sha256).hexdigest()[:32]


def state_of(tokens: int, warn_at: float, exhaust_at: float) -> BudgetState:
    """The state a budget of ``tokens`` is in."""
    return "exhausted" if tokens >= exhaust_at else "warning" if tokens >= warn_at else "ok"
